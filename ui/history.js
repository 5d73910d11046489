// @ts-check
// The History panel: past runs, newest first; open one to see its result, resume one cut short.

import * as api from './api.js';
import { $, basename, formatDate, formatLoss, h, setMessage } from './dom.js';
import { renderEntryStatus, resumeTraining, setChart } from './progress.js';
import { showResult } from './result.js';
import { fillFields, runInputsChanged } from './run.js';
import { state } from './state.js';
import { showTab, updateButtons } from './steps.js';

/** @typedef {import('./types.js').HistoryEntry} HistoryEntry */

/** @param {HistoryEntry[]} entries */
export function renderHistory(entries) {
  const sorted = [...entries].sort((a, b) => b.started_at - a.started_at);
  $('history-empty').hidden = sorted.length > 0;
  $('history-list').replaceChildren(...sorted.map(historyItem));
  updateButtons();
}

/** @param {HistoryEntry} entry */
function historyItem(entry) {
  const button = h('button', { type: 'button', class: 'history-item', 'data-id': entry.id },
    h('span', {}, formatDate(entry.started_at)),
    h('span', { class: 'path' }, basename(entry.request.dataset)),
    h('span', { class: 'status-text', 'data-status': entry.status }, entry.status),
    h('span', {}, entry.final_loss != null ? `loss ${formatLoss(entry.final_loss)}` : '–'),
    h('span', { class: 'published', title: entry.cact?.published?.url ?? '' }, entry.cact?.published ? 'published' : ''));
  if (entry.id === state.viewedId) button.setAttribute('aria-current', 'true');
  button.addEventListener('click', () => openTraining(entry.id));
  if (!entry.resumable) return h('li', {}, button);
  const resume = h('button', { type: 'button', class: 'history-resume', 'data-id': entry.id }, 'Resume');
  resume.addEventListener('click', () => resumeTraining(entry.id));
  return h('li', {}, button, resume);
}

export async function refreshHistory() {
  try {
    renderHistory(await api.history());
    setMessage($('history-error'), null);
  } catch (error) {
    setMessage($('history-error'), error);
  }
}

/**
 * Shows a past run everywhere: its settings, chart, status, result and scores.
 * @param {string} id
 */
export async function openTraining(id) {
  try {
    const { entry, chart } = await api.openTraining(id);
    state.viewedId = id;
    fillFields(entry.request.settings);
    runInputsChanged();
    setChart(chart, 'No loss chart was recorded for this run.');
    renderEntryStatus(entry);
    showResult(entry);
    showTab('evaluate');
    for (const item of document.querySelectorAll('.history-item')) {
      if (/** @type {HTMLElement} */ (item).dataset.id === id) item.setAttribute('aria-current', 'true');
      else item.removeAttribute('aria-current');
    }
    setMessage($('history-error'), null);
  } catch (error) {
    setMessage($('history-error'), error);
  }
}
