// @ts-check
// The step tabs (Model, Data, Train, Evaluate, Export, History) and which controls the state allows.

import { $ } from './dom.js';
import { state } from './state.js';

/**
 * Shows one step's panel; the header (steps and the run strip) stays in view.
 * @param {string} name
 */
export function showTab(name) {
  for (const tab of document.querySelectorAll('.steps [role="tab"]')) {
    const { tab: tabName = '' } = /** @type {HTMLElement} */ (tab).dataset;
    const selected = tabName === name;
    tab.setAttribute('aria-selected', String(selected));
    /** @type {HTMLElement} */ (tab).tabIndex = selected ? 0 : -1;
    $(`panel-${tabName}`).hidden = !selected;
  }
  window.scrollTo(0, 0); // a step starts at its top, not where the last one was left
}

/**
 * Marks a step that has news (a finished run to evaluate, say) until it is opened.
 * @param {string} name @param {string|null} badge
 */
export function badgeTab(name, badge) {
  const tab = $(`tab-${name}`);
  if (tab.getAttribute('aria-selected') === 'true' || !badge) tab.removeAttribute('data-badge');
  else tab.dataset.badge = badge;
}

export function wireSteps() {
  for (const tab of document.querySelectorAll('.steps [role="tab"]')) {
    const { tab: name = '' } = /** @type {HTMLElement} */ (tab).dataset;
    tab.addEventListener('click', () => {
      showTab(name);
      badgeTab(name, null);
    });
  }
}

/** Enables what the state allows: one run and one build at a time, Start only for a valid run. */
export function updateButtons() {
  $('start-button').disabled = state.invalid || state.running;
  $('plan-button').disabled = state.invalid || state.planning;
  $('cancel-button').disabled = !state.running;
  $('resume-button').hidden = state.running || !state.statusEntry?.resumable;
  $('build-button').disabled = state.building;
  for (const item of document.querySelectorAll('.history-item, .history-resume')) {
    /** @type {HTMLButtonElement} */ (item).disabled = state.running || state.building;
  }
}
