// @ts-check
// The Progress panel and the run strip under the steps: start, resume and cancel a run, and follow
// its channel (steps, loss chart, log) to its end.

import * as api from './api.js';
import { $, backendLabel, errorText, formatBytes, formatClock, formatCount, formatElapsed, formatLoss, h, setMessage,
  setStatus } from './dom.js';
import { openTraining, refreshHistory } from './history.js';
import { showResult } from './result.js';
import { currentRun } from './run.js';
import { state } from './state.js';
import { badgeTab, showTab, updateButtons } from './steps.js';

/** @typedef {import('./types.js').HistoryEntry} HistoryEntry */
/** @typedef {import('./types.js').TrainingMessage} TrainingMessage */
/** @typedef {import('./types.js').RunStatus} RunStatus */
/** @typedef {import('./types.js').TrainEvent} TrainEvent */

const CHART_PLACEHOLDER = 'The loss chart appears once training starts.';

/**
 * The run's status line, in the panel and in the strip.
 * @param {RunStatus|'stopping'} status @param {string} text
 */
function setRunStatus(status, text) {
  setStatus($('run-status'), status, text);
  setStatus($('strip-status'), status, text);
}

/** @param {boolean} running */
function setRunning(running) {
  state.running = running;
  $('cancel-button').textContent = 'Cancel';
  setMessage($('cancel-error'), null);
  updateButtons();
}

/**
 * @param {string|null} svg the chart's markup, drawn by the app
 * @param {string} [placeholder] what to say when there is none
 */
export function setChart(svg, placeholder = CHART_PLACEHOLDER) {
  if (svg) $('loss-chart').innerHTML = svg; // SVG markup from our own Rust: trusted
  else $('loss-chart').replaceChildren(h('p', { class: 'muted' }, placeholder));
}

/** @param {number} done @param {number} total */
function renderSteps(done, total) {
  for (const bar of [$('progress'), $('strip-progress')]) {
    bar.max = Math.max(1, total);
    bar.value = done;
  }
  $('progress-text').textContent = `${done} / ${total} steps`;
}

/** @param {string} line */
function appendLog(line) {
  const pre = $('log-lines');
  pre.append(`${line}\n`);
  pre.scrollTop = pre.scrollHeight;
}

function resetProgress() {
  renderSteps(0, 0);
  $('step-loss').textContent = '';
  $('eta').textContent = '–';
  $('tokens-per-s').textContent = '–';
  $('log-lines').textContent = '';
  setChart(null);
}

/**
 * @param {HistoryEntry} entry
 * @param {string} [message] how the run ended, when its channel said
 */
function describeEntry(entry, message) {
  const took = entry.seconds != null ? ` in ${formatElapsed(entry.seconds)}` : '';
  const validation = entry.final_val != null ? `, validation ${formatLoss(entry.final_val)}` : '';
  const losses = entry.final_loss != null ? ` — final loss ${formatLoss(entry.final_loss)}${validation}` : '';
  switch (entry.status) {
    case 'finished': return `Finished${took}${losses}`;
    case 'stopped': return `Stopped after ${entry.steps_done} / ${entry.steps} steps${took}${losses}`;
    case 'failed': return message ?? entry.message ?? 'The run failed.';
    case 'interrupted': return `Interrupted after ${entry.steps_done} / ${entry.steps} steps: ${entry.message}`;
    default: return 'Running…';
  }
}

/** @param {HistoryEntry} entry @param {string} [message] */
export function renderEntryStatus(entry, message) {
  state.statusEntry = entry;
  setRunStatus(entry.status, describeEntry(entry, message));
  renderSteps(entry.steps_done, entry.steps);
  updateButtons();
}

/**
 * Starts a run (fresh: the panel starts empty) or resumes one; its messages arrive on a channel.
 * @param {(onEvent: (message: TrainingMessage) => void) => Promise<HistoryEntry>} launch
 * @param {boolean} fresh
 */
async function runInWorker(launch, fresh) {
  if (fresh) resetProgress();
  showResult(null);
  state.statusEntry = null;
  setRunning(true);
  setRunStatus('running', 'Starting…');
  try {
    const entry = await launch(handleRunEvent);
    state.viewedId = entry.id;
    refreshHistory();
  } catch (error) {
    setRunning(false);
    setRunStatus('failed', errorText(error));
  }
}

const startTraining = () => runInWorker((onEvent) => api.startTraining(currentRun(), onEvent), true);

/**
 * Continues a run that ended early from its saved state; its chart goes on where it stopped.
 * @param {string} id
 */
export async function resumeTraining(id) {
  await openTraining(id); // the run's own chart and status, which the resumed steps carry on
  $('log-lines').textContent = '';
  showTab('train');
  return runInWorker((onEvent) => api.resumeTraining(id, onEvent), false);
}

/** @param {TrainingMessage} message */
function handleRunEvent(message) {
  switch (message.kind) {
    case 'progress':
      handleTrainEvent(message);
      break;
    case 'chart':
      setChart(message.svg);
      break;
    case 'log':
      appendLog(message.line);
      break;
    case 'finished':
      runEnded(message.entry);
      break;
    case 'failed':
      runEnded(message.entry, message.message);
      break;
  }
}

/**
 * The worker's own events, passed on as they are.
 * @param {TrainEvent} event
 */
function handleTrainEvent(event) {
  switch (event.event) {
    case 'started': {
      if (!state.running) break; // a late message from a run that already ended
      const where = `${backendLabel(event.backend)} (${event.device})`;
      const text = `Training on ${where}: ${formatCount(event.examples)} examples, ${formatCount(event.validation)} ` +
        `held out, sequence length ${event.seq_len}, est. peak memory ${formatBytes(event.memory_estimate_bytes)}`;
      if ($('run-status').dataset.status === 'running') setRunStatus('running', text);
      renderSteps(event.first_step, event.steps);
      appendLog(`${text}; ${event.steps} steps, ${event.warmup} warm-up`);
      break;
    }
    case 'step':
      renderSteps(event.step, event.total);
      $('step-loss').textContent = `loss ${formatLoss(event.loss)} · lr ${event.lr.toExponential(1)}`;
      $('eta').textContent = formatClock(event.eta_s);
      $('tokens-per-s').textContent = formatCount(Math.round(event.tokens_per_s));
      break;
    case 'epoch': {
      const validation = event.val != null ? `, validation ${formatLoss(event.val)}` : '';
      appendLog(`Epoch ${event.epoch}: loss ${formatLoss(event.loss)}${validation}`);
      break;
    }
  }
}

/** @param {HistoryEntry} entry @param {string} [message] */
function runEnded(entry, message) {
  setRunning(false);
  state.viewedId = entry.id;
  renderEntryStatus(entry, message);
  showResult(entry);
  badgeTab('evaluate', entry.scores ? '•' : null);
  if (message) appendLog(message);
  refreshHistory();
}

async function cancelTraining() {
  try {
    const answer = await api.cancelTraining();
    if (answer === 'stopping') {
      setRunStatus('stopping', 'Stopping after this step… (press again to stop now)');
      $('cancel-button').textContent = 'Stop now';
    } else if (answer === 'killed') {
      setRunStatus('stopping', 'Stopping now…');
    } else {
      setRunning(false); // nothing was running any more
    }
  } catch (error) {
    setMessage($('cancel-error'), error);
  }
}

export function wireProgress() {
  $('start-button').addEventListener('click', startTraining);
  $('cancel-button').addEventListener('click', cancelTraining);
  $('resume-button').addEventListener('click', () => state.statusEntry && resumeTraining(state.statusEntry.id));
}
