// @ts-check
// A secret's field (Generate's API key, Publish's hub token): where it comes from, and Keep and Forget
// for one typed in the window. The app keeps it (src-tauri/src/secrets/keys.rs); the page never holds it.

import * as api from './api.js';
import { $, setMessage } from './dom.js';

/** @typedef {import('./types.js').KeySource} KeySource */
/** @typedef {import('./types.js').SecretName} SecretName */
/** The secrets' fields in index.html, whose ids their elements' ids start with. @typedef {'generate-key' | 'publish-token'} KeyField */

/**
 * Shows where the secret whose elements' ids start with `prefix` comes from.
 * @param {KeyField} prefix @param {KeySource} key
 */
export function renderKey(prefix, key) {
  const typed = key.source === 'keychain' || key.source === 'session';
  $(`${prefix}-source`).textContent =
    key.source === 'environment' ? `From ${key.variable}`
      : key.source === 'keychain' ? 'Kept in the keychain'
        : key.source === 'session' ? `Typed: ${key.note}`
          : '';
  $(prefix).hidden = key.source !== 'none';
  $(`${prefix}-keep`).hidden = key.source !== 'none';
  $(`${prefix}-forget`).hidden = !typed;
  $(prefix).value = '';
}

/**
 * Wires Keep and Forget of the secret `name`, whose elements' ids start with `prefix`.
 * @param {KeyField} prefix @param {SecretName} name @param {HTMLElement} errorEl where a refusal is shown
 */
export function wireKey(prefix, name, errorEl) {
  /** @param {() => Promise<KeySource>} change */
  const changeKey = async (change) => {
    setMessage(errorEl, null);
    try {
      renderKey(prefix, await change());
    } catch (error) {
      setMessage(errorEl, error);
    }
  };
  $(`${prefix}-keep`).addEventListener('click', () => changeKey(() => api.rememberKey(name, $(prefix).value)));
  $(`${prefix}-forget`).addEventListener('click', () => changeKey(() => api.forgetKey(name)));
}
