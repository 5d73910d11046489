// @ts-check
// The Hardware panel: the backend the engine picked, and the device choice.

import { $, backendLabel, formatBytes, h } from './dom.js';
import { runInputsChanged, savePreferences } from './run.js';

/** @typedef {import('./types.js').BackendInfo} BackendInfo */

/**
 * @param {BackendInfo} hardware
 * @param {string[]} devices the device selector's choices
 * @param {string} selected the remembered choice
 */
export function renderHardware(hardware, devices, selected) {
  const badge = $('backend-badge');
  badge.textContent = backendLabel(hardware.backend);
  badge.dataset.backend = hardware.backend;
  $('device-name').textContent = hardware.device;
  const free = hardware.memory_free_bytes != null ? `, ${formatBytes(hardware.memory_free_bytes)} free` : '';
  $('device-memory').textContent =
    hardware.memory_bytes != null ? `(${formatBytes(hardware.memory_bytes)}${free})` : '(memory unknown)';
  $('device-reason').textContent = hardware.reason;
  const select = $('device-select');
  select.replaceChildren(...devices.map((device) => h('option', { value: device }, backendLabel(device))));
  select.value = devices.includes(selected) ? selected : devices[0];
}

export function wireHardware() {
  $('device-select').addEventListener('change', () => {
    savePreferences();
    runInputsChanged();
  });
}
