// @ts-check
// Needle Studio's window. All logic and state live in Rust (src-tauri); these modules only call its
// commands (ground/api.js) and render what they return and what their channels send. Each step's
// panel is one module in steps/, named for its tab; panels never import each other, they tell each
// other what changed through ground/state.js. This one wires the panels and fills them at start-up.

import * as api from './ground/api.js';
import { $, errorText, setMessage } from './ground/dom.js';
import { tell } from './ground/state.js';
import { showTab, wireTabs } from './ground/tabs.js';
import { loadDataset, showGenerateSetup, wireData } from './steps/data.js';
import { wireEvaluate } from './steps/evaluate.js';
import { showBuildWidths, showPublishSetup, wireExport } from './steps/export.js';
import { renderHistory, wireHistory } from './steps/history.js';
import { refreshHub, renderHardware, showModelPaths, wireModel } from './steps/model.js';
import { showTrainingSettings, wireTrain } from './steps/train.js';

async function init() {
  if (!api.hasRuntime()) {
    setMessage($('app-error'), 'Needle Studio must run inside its desktop app: the Tauri runtime is missing.');
    return;
  }
  wireModel();
  wireData();
  wireTrain();
  wireEvaluate();
  wireExport();
  wireHistory();
  wireTabs();
  try {
    const startup = await api.startup();
    showTrainingSettings(startup);
    showBuildWidths(startup.build_widths);
    renderHardware(startup.hardware, startup.devices, startup.preferences.device);
    showModelPaths(startup.preferences);
    // A first start has no base model yet: that is the first step. Otherwise start with the data.
    showTab(startup.preferences.checkpoint ? 'data' : 'model');
    tell('inputs', null);
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
