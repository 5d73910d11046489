// @ts-check
// The file dialogs and "Show in folder", each showing its failure where the caller says.

import * as api from './api.js';
import { setMessage } from './dom.js';

/**
 * Opens the file dialog (or the save dialog) for one extension (or a few); returns the path or null.
 * @param {{name: string, ext: string|string[], current?: string|null, errorEl: HTMLElement, save?: boolean}} options
 */
export async function pickPath({ errorEl, ...options }) {
  try {
    return await api.choosePath(options);
  } catch (error) {
    setMessage(errorEl, error);
    return null;
  }
}

/** @param {string} path @param {HTMLElement} errorEl */
export async function reveal(path, errorEl) {
  try {
    await api.reveal(path);
  } catch (error) {
    setMessage(errorEl, error);
  }
}
