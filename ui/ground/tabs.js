// @ts-check
// The step tabs (Model, Data, Train, Evaluate, Export, History): which step's panel shows, and a
// badge on a step with news.

import { $ } from './dom.js';

/**
 * Shows one step's panel; the header (steps and the training strip) stays in view.
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
 * Marks a step that has news (a finished training to evaluate, say) until it is opened.
 * @param {string} name @param {string|null} badge
 */
export function badgeTab(name, badge) {
  const tab = $(`tab-${name}`);
  if (tab.getAttribute('aria-selected') === 'true' || !badge) tab.removeAttribute('data-badge');
  else tab.dataset.badge = badge;
}

export function wireTabs() {
  for (const tab of document.querySelectorAll('.steps [role="tab"]')) {
    const { tab: name = '' } = /** @type {HTMLElement} */ (tab).dataset;
    tab.addEventListener('click', () => {
      showTab(name);
      badgeTab(name, null);
    });
  }
}
