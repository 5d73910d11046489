// @ts-check
// The step tabs (Model, Data, Train, Evaluate, Export, History): which step's panel shows, and a
// badge on a step with news.

import { $ } from './dom.js';

/** The steps, as index.html's tabs (`tab-<step>`) and panels (`panel-<step>`) name them. */
const STEPS = /** @type {const} */ (['model', 'data', 'train', 'evaluate', 'export', 'history']);
/** @typedef {typeof STEPS[number]} Step */

/**
 * Shows one step's panel; the header (steps and the training strip) stays in view.
 * @param {Step} name
 */
export function showTab(name) {
  for (const step of STEPS) {
    const selected = step === name;
    const tab = $(`tab-${step}`);
    tab.setAttribute('aria-selected', String(selected));
    tab.tabIndex = selected ? 0 : -1;
    $(`panel-${step}`).hidden = !selected;
  }
  window.scrollTo(0, 0); // a step starts at its top, not where the last one was left
}

/**
 * Marks a step that has news (a finished training to evaluate, say) until it is opened.
 * @param {Step} name @param {string|null} badge
 */
export function badgeTab(name, badge) {
  const tab = $(`tab-${name}`);
  if (tab.getAttribute('aria-selected') === 'true' || !badge) tab.removeAttribute('data-badge');
  else tab.dataset.badge = badge;
}

export function wireTabs() {
  for (const step of STEPS) {
    $(`tab-${step}`).addEventListener('click', () => {
      showTab(step);
      badgeTab(step, null);
    });
  }
}
