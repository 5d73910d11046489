// @ts-check
// Needle Studio's window. All logic and state live in Rust (src-tauri); these modules only call its
// commands (api.js) and render what they return and what their channels send. This one wires the
// panels and fills them at start-up. Panels call each other's functions (never at load time), so
// the imports between them may go both ways.

import * as api from './api.js';
import { loadDataset, wireDataset } from './dataset.js';
import { $, errorText, setMessage } from './dom.js';
import { wireEvaluate } from './evaluate.js';
import { showGenerateSetup, wireGenerate } from './generate.js';
import { renderHardware, wireHardware } from './hardware.js';
import { renderHistory } from './history.js';
import { refreshHub, showModelPaths, wireModel } from './model.js';
import { wireProgress } from './progress.js';
import { showBuildWidths, showPublishSetup, wireResult } from './result.js';
import { runInputsChanged, showRunSettings, wireRun } from './run.js';
import { showTab, wireSteps } from './steps.js';

async function init() {
  if (!api.hasRuntime()) {
    setMessage($('app-error'), 'Needle Studio must run inside its desktop app: the Tauri runtime is missing.');
    return;
  }
  wireHardware();
  wireDataset();
  wireModel();
  wireRun();
  wireProgress();
  wireResult();
  wireEvaluate();
  wireGenerate();
  wireSteps();
  try {
    const startup = await api.startup();
    showRunSettings(startup);
    showBuildWidths(startup.build_widths);
    renderHardware(startup.hardware, startup.devices, startup.preferences.device);
    showModelPaths(startup.preferences);
    // A first start has no base model yet: that is the first step. Otherwise start with the data.
    showTab(startup.preferences.checkpoint ? 'data' : 'model');
    runInputsChanged();
    renderHistory(startup.history);
    if (startup.dataset) loadDataset(startup.dataset);
    refreshHub();
    showGenerateSetup();
    showPublishSetup();
  } catch (error) {
    setMessage($('app-error'), `Could not start: ${errorText(error)}`);
  }
}

init();
