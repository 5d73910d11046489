// Needle Studio web UI. All logic and state live in Rust (src-tauri); this file only calls the commands
// and renders what they return and what their channels send. Contract: the app contract's commands,
// channel messages and DOM ids.
'use strict';

const tauri = window.__TAURI__;
const $ = (id) => document.getElementById(id);

const FIELDS = ['epochs', 'lr', 'rank', 'alpha', 'batch_size', 'max_len', 'val_split', 'seed'];
const PATH_FIELDS = ['dataset', 'checkpoint', 'tokenizer'];
const VALIDATED = [...FIELDS, ...PATH_FIELDS, 'device'];
const BACKEND_LABELS = { auto: 'Automatic', cpu: 'CPU', cuda: 'CUDA', metal: 'Metal' };
const CHART_PLACEHOLDER = 'The loss chart appears once training starts.';

const state = {
  presets: [],
  preset: null, // last preset chosen (saved in settings)
  dataset: null, // path of the chosen dataset, even if it failed to load
  invalid: true,
  planning: false,
  running: false,
  building: false,
  entry: null, // the run shown in the result panel
  statusEntry: null, // the run whose status the progress panel shows (Resume continues it)
  viewedId: null, // the run highlighted in the history
  hub: null, // the base model's status, as `base_model` last said
};

// ---------- small helpers ----------

const invoke = (command, args) => tauri.core.invoke(command, args);
const errorText = (error) => (typeof error === 'string' ? error : error?.message ?? String(error));

/** Shows a message (string or caught error) in an element, hiding the element when there is none. */
function setMessage(el, message) {
  const text = message ? errorText(message) : '';
  el.textContent = text;
  el.hidden = !text;
}

function debounce(fn, ms) {
  let timer;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

/** Creates an element with attributes and children (strings become text, never HTML). */
function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  node.append(...children.filter((child) => child != null));
  return node;
}

function formatBytes(bytes) {
  if (bytes == null) return 'unknown';
  const gib = bytes / 2 ** 30;
  return gib >= 1 ? `${gib.toFixed(1)} GiB` : `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

const formatCount = (n) => (n == null ? '–' : Number(n).toLocaleString());
const formatLoss = (x) => (x == null ? '–' : x.toFixed(3));

/** m:ss or h:mm:ss */
function formatClock(seconds) {
  if (seconds == null || !Number.isFinite(seconds)) return '–';
  const total = Math.max(0, Math.round(seconds));
  const [hours, minutes, secs] = [Math.floor(total / 3600), Math.floor(total / 60) % 60, total % 60];
  const pad = (n) => String(n).padStart(2, '0');
  return hours ? `${hours}:${pad(minutes)}:${pad(secs)}` : `${minutes}:${pad(secs)}`;
}

const formatElapsed = (seconds) => (seconds < 60 ? `${seconds.toFixed(1)} s` : formatClock(seconds));
const formatDate = (unixSeconds) =>
  new Date(unixSeconds * 1000).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' });
const basename = (path) => (path ? path.split(/[\\/]/).pop() : '');
const backendLabel = (backend) => BACKEND_LABELS[backend] ?? backend;

/** Sets a status line: its data-status (styling, tests) and its sentence. */
function setStatus(el, status, text) {
  el.dataset.status = status;
  el.textContent = text;
}

/** Opens the file dialog (or the save dialog) for one extension; returns the path or null. */
async function pickPath({ name, ext, current, errorEl, save = false }) {
  const options = { filters: [{ name, extensions: [ext] }], ...(current ? { defaultPath: current } : {}) };
  try {
    const path = save ? await tauri.dialog.save(options) : await tauri.dialog.open({ ...options, multiple: false });
    return typeof path === 'string' ? path : null;
  } catch (error) {
    setMessage(errorEl, error);
    return null;
  }
}

async function reveal(path, errorEl) {
  try {
    await invoke('reveal', { path });
  } catch (error) {
    setMessage(errorEl, error);
  }
}

// ---------- settings and validation ----------

/** Reads the run fields: numbers for the valid ones, a message for the rest. */
function readSettings() {
  const settings = {};
  const errors = {};
  for (const field of FIELDS) {
    const input = $(`field-${field}`);
    const raw = input.value.trim();
    const value = Number(raw);
    if (raw === '' || !Number.isFinite(value)) errors[field] = 'Enter a number.';
    else if (input.dataset.kind === 'int' && !Number.isInteger(value)) errors[field] = 'Enter a whole number.';
    else settings[field] = value;
  }
  return { settings, errors };
}

function fillFields(settings) {
  for (const field of FIELDS) $(`field-${field}`).value = String(settings[field]);
}

function pathValue(field) {
  return field === 'dataset' ? state.dataset ?? '' : $(`${field}-path`).value.trim();
}

function runRequest(settings) {
  return {
    dataset: pathValue('dataset'),
    checkpoint: pathValue('checkpoint'),
    tokenizer: pathValue('tokenizer'),
    device: $('device-select').value,
    settings,
  };
}

async function saveSettings() {
  const settings = {
    checkpoint: pathValue('checkpoint') || null,
    tokenizer: pathValue('tokenizer') || null,
    device: $('device-select').value,
    preset: state.preset,
  };
  try {
    await invoke('save_settings', { settings });
    setMessage($('app-error'), null);
  } catch (error) {
    setMessage($('app-error'), `Could not save settings: ${errorText(error)}`);
  }
}

let validateSeq = 0;
async function validate() {
  const seq = ++validateSeq;
  const { settings, errors } = readSettings();
  let serverErrors = {};
  if (Object.keys(errors).length === 0) {
    try {
      serverErrors = await invoke('validate_run', { run: runRequest(settings) });
    } catch (error) {
      serverErrors = { request: errorText(error) };
    }
    if (seq !== validateSeq) return; // a newer check is under way
  }
  renderValidation({ ...serverErrors, ...errors });
}
const scheduleValidate = debounce(validate, 150);

/** Anything that goes into a run changed: the plan is stale, the presets and validation need a look. */
function runInputsChanged() {
  $('plan').replaceChildren();
  renderPresets();
  scheduleValidate();
}

function updateButtons() {
  $('start-button').disabled = state.invalid || state.running;
  $('plan-button').disabled = state.invalid || state.planning;
  $('cancel-button').disabled = !state.running;
  $('resume-button').hidden = state.running || !state.statusEntry?.resumable;
  $('build-button').disabled = state.building;
  for (const item of document.querySelectorAll('.history-item, .history-resume')) {
    item.disabled = state.running || state.building;
  }
}

// ---------- steps ----------

/** Shows one step's panel; the header (steps and the run strip) stays in view. */
function showTab(name) {
  for (const tab of document.querySelectorAll('.steps [role="tab"]')) {
    const selected = tab.dataset.tab === name;
    tab.setAttribute('aria-selected', String(selected));
    tab.tabIndex = selected ? 0 : -1;
    $(`panel-${tab.dataset.tab}`).hidden = !selected;
  }
  window.scrollTo(0, 0); // a step starts at its top, not where the last one was left
}

/** Marks a step that has news (a finished run to evaluate, say) until it is opened. */
function badgeTab(name, badge) {
  const tab = $(`tab-${name}`);
  if (tab.getAttribute('aria-selected') === 'true' || !badge) tab.removeAttribute('data-badge');
  else tab.dataset.badge = badge;
}

// ---------- hardware ----------

function renderHardware(hardware, devices, selected) {
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

// ---------- dataset ----------

let datasetSeq = 0;
async function loadDataset(path) {
  const seq = ++datasetSeq;
  state.dataset = path;
  $('dataset-path').textContent = path;
  $('dataset-path').classList.remove('muted');
  setMessage($('dataset-error'), null);
  runInputsChanged();
  const maxLen = readSettings().settings.max_len;
  if (maxLen == null) {
    $('dataset-report').hidden = true;
    setMessage($('dataset-error'), 'Enter a valid max length to read the dataset.');
    return;
  }
  try {
    const report = await invoke('load_dataset', { path, tokenizer: pathValue('tokenizer') || null, maxLen });
    if (seq === datasetSeq) renderReport(report);
  } catch (error) {
    if (seq !== datasetSeq) return;
    $('dataset-report').hidden = true;
    setMessage($('dataset-error'), error);
  }
}
const scheduleDatasetReload = debounce(() => state.dataset && loadDataset(state.dataset), 300);

async function chooseDataset() {
  const errorEl = $('dataset-error');
  const path = await pickPath({ name: 'JSONL dataset', ext: 'jsonl', current: state.dataset, errorEl });
  if (path) loadDataset(path);
}

function handleDragDrop({ payload }) {
  $('drop-zone').classList.toggle('dragging', payload.type === 'enter' || payload.type === 'over');
  if (payload.type !== 'drop') return;
  const path = (payload.paths ?? []).find((p) => p.toLowerCase().endsWith('.jsonl'));
  if (path) loadDataset(path);
  else setMessage($('dataset-error'), 'That is not a .jsonl file: drop a file with one JSON example per line.');
}

function renderReport(report) {
  $('dataset-report').hidden = false;
  prefillTry(report.samples[0]);
  $('report-examples').textContent = String(report.usable_examples); // plain numbers where tests read them
  $('report-skipped').textContent = String(report.skipped_lines);
  const lengths = report.token_lengths;
  $('report-lengths').textContent = lengths ? `${lengths.min} / ${lengths.median} / ${lengths.max}` : '–';
  $('report-seq-len').textContent = `${report.seq_len} (cap ${report.cap})`;
  setMessage(
    $('report-truncation'),
    report.truncated > 0 &&
      `${formatCount(report.truncated)} example(s) are longer than the sequence length (${report.seq_len} tokens) ` +
        'and will be truncated. Raise Max length to keep them whole.',
  );
  renderHistogram(report.histogram);
  renderProblems(report);
  renderSamples(report.samples.slice(0, 3));
}

function renderHistogram(bins) {
  const most = Math.max(1, ...bins.map((bin) => bin.count));
  $('report-histogram').replaceChildren(
    ...bins.map((bin) => {
      const bar = h('span', { class: 'bar', 'aria-hidden': 'true' });
      bar.style.width = `${(100 * bin.count) / most}%`;
      return h('li', {}, h('span', { class: 'bin' }, `≤${bin.up_to}`), h('span', {}, bar),
        h('span', { class: 'count' }, formatCount(bin.count)));
    }),
  );
}

/** The first problems word for word (the report keeps at most a hundred), then counts of the rest. */
function renderProblems(report) {
  const { problems, problems_total: total, problem_counts: counts } = report;
  $('report-problems-box').hidden = total === 0;
  const items = problems.map((problem) =>
    h('li', {}, problem.message, h('span', { class: 'tag' }, problem.skipped ? 'skipped' : 'kept')));
  if (total > problems.length) {
    const byKind = Object.entries(counts).map(([kind, n]) => `${formatCount(n)} ${kind.replaceAll('_', ' ')}`);
    items.push(h('li', { class: 'muted' },
      `… and ${formatCount(total - problems.length)} more (${byKind.join(', ')}); \`needle data\` lists the same.`));
  }
  $('report-problems').replaceChildren(...items);
}

function renderSamples(samples) {
  $('report-samples').replaceChildren(
    ...samples.map((sample) =>
      h('div', { class: 'sample' },
        h('div', { class: 'muted small' }, `Line ${sample.line} · ${formatCount(sample.tokens)} tokens`),
        h('div', { class: 'label' }, 'Prompt'), h('pre', {}, sample.prompt),
        h('div', { class: 'label' }, 'Target'), h('pre', {}, sample.target))),
  );
}

// ---------- base model ----------

function wireModelPath(name, label, ext) {
  const input = $(`${name}-path`);
  const commit = () => {
    saveSettings();
    runInputsChanged();
    if (state.hub) renderHub(state.hub);
    if (name === 'tokenizer') scheduleDatasetReload();
  };
  input.addEventListener('input', runInputsChanged);
  input.addEventListener('change', commit);
  $(`${name}-choose`).addEventListener('click', async () => {
    const path = await pickPath({ name: label, ext, current: input.value.trim(), errorEl: $(`error-${name}`) });
    if (!path) return;
    input.value = path;
    commit();
  });
}

// ---------- base model from the hub ----------

/** The hub row: Needle 2 cached (with its path), downloading (bar, Cancel), or offered with its size. */
function renderHub(status) {
  state.hub = status;
  const { cached, download } = status;
  const running = download.state === 'running';
  $('hub-download').hidden = Boolean(cached) || running;
  $('hub-use').hidden = !cached || pathValue('checkpoint') === cached.checkpoint;
  $('hub-cancel').hidden = !running;
  $('hub-progress').hidden = !running;
  if (running) {
    renderHubProgress(download.file, download.bytes, download.total, null);
  } else if (cached) {
    setStatus($('hub-status'), 'cached', 'Needle 2 is on this computer');
    $('hub-detail').textContent = cached.checkpoint;
  } else {
    setStatus($('hub-status'), 'idle', `Needle 2 is not on this computer yet (${status.repo})`);
    const resume = status.partial_bytes > 0 ? `; ${formatBytes(status.partial_bytes)} already here, it resumes` : '';
    $('hub-detail').textContent = status.download_bytes != null
      ? `${formatBytes(status.download_bytes)} to download${resume}`
      : status.note ?? '';
    $('hub-download').textContent = status.partial_bytes > 0 ? 'Resume download' : 'Download Needle 2';
  }
  const failed = download.state === 'failed' || download.state === 'cancelled';
  setMessage($('hub-error'), failed && !cached ? download.message : null);
}

function renderHubProgress(file, bytes, total, rate) {
  setStatus($('hub-status'), 'running', `Downloading ${basename(file) || 'Needle 2'}…`);
  $('hub-progress').max = Math.max(1, total);
  $('hub-progress').value = bytes;
  const speed = rate ? ` · ${formatBytes(rate)}/s` : '';
  $('hub-detail').textContent = `${formatBytes(bytes)} of ${formatBytes(total)}${speed}`;
}

async function refreshHub() {
  try {
    renderHub(await invoke('base_model'));
  } catch (error) {
    setMessage($('hub-error'), error);
  }
}

/** Fills the model fields with Needle 2's files, as if chosen by hand. */
function useBaseModel(base) {
  $('checkpoint-path').value = base.checkpoint;
  $('tokenizer-path').value = base.tokenizer;
  saveSettings();
  runInputsChanged();
  scheduleDatasetReload();
}

async function downloadBaseModel() {
  const channel = new tauri.core.Channel();
  channel.onmessage = (message) => {
    if (message.kind === 'progress') {
      if (message.event === 'started' || message.event === 'progress') {
        const bytes = message.bytes ?? message.resumed_from;
        renderHubProgress(message.file, bytes, message.total, message.bytes_per_s);
      }
      return;
    }
    if (message.base) useBaseModel(message.base);
    refreshHub();
  };
  setMessage($('hub-error'), null);
  renderHub({ ...state.hub, download: { state: 'running', file: '', bytes: 0, total: 0 } });
  try {
    await invoke('download_base_model', { onEvent: channel });
  } catch (error) {
    setMessage($('hub-error'), error);
    refreshHub();
  }
}

async function cancelDownload() {
  try {
    await invoke('cancel_download');
  } catch (error) {
    setMessage($('hub-error'), error);
  }
}

// ---------- run settings ----------

function renderPresets() {
  const { settings } = readSettings();
  const active = state.presets.find((preset) => FIELDS.every((f) => preset.settings[f] === settings[f]));
  for (const preset of state.presets) {
    const button = $(`preset-${preset.name}`);
    if (!button) continue;
    button.textContent = preset.label;
    button.title = preset.description;
    button.setAttribute('aria-pressed', String(preset === active));
  }
  $('preset-description').textContent = active ? active.description : 'Custom settings';
}

function applyPreset(name) {
  const preset = state.presets.find((p) => p.name === name);
  if (!preset) return;
  const oldMaxLen = readSettings().settings.max_len;
  state.preset = name;
  fillFields(preset.settings);
  saveSettings();
  runInputsChanged();
  if (preset.settings.max_len !== oldMaxLen) scheduleDatasetReload();
}

function renderValidation(errors) {
  for (const field of VALIDATED) {
    const message = errors[field] ?? '';
    const errorEl = $(`error-${field}`);
    // An empty path is a to-do rather than a mistake: say so quietly, without a red outline.
    const isTodo = PATH_FIELDS.includes(field) && !pathValue(field);
    setMessage(errorEl, message);
    errorEl.classList.toggle('hint', isTodo);
    const input = document.querySelector(`[aria-describedby~="error-${field}"]`);
    if (message && !isTodo) input?.setAttribute('aria-invalid', 'true');
    else input?.removeAttribute('aria-invalid');
  }
  const others = Object.entries(errors).filter(([field]) => !VALIDATED.includes(field));
  state.invalid = Object.keys(errors).length > 0;
  $('start-hint').textContent = others.length
    ? others.map(([, message]) => message).join(' ')
    : state.invalid ? 'Complete the fields noted above to start.' : '';
  updateButtons();
}

async function checkPlan() {
  state.planning = true;
  updateButtons();
  $('plan').textContent = 'Planning…';
  try {
    renderPlan(await invoke('plan_run', { run: runRequest(readSettings().settings) }));
  } catch (error) {
    $('plan').replaceChildren(h('p', { class: 'error' }, errorText(error)));
  } finally {
    state.planning = false;
    updateButtons();
  }
}

function renderPlan(plan) {
  const weights = Array.isArray(plan.adapted_weights) ? plan.adapted_weights.length : plan.adapted_weights;
  const rows = [
    ['Steps', `${formatCount(plan.steps)} (${formatCount(plan.steps_per_epoch)} per epoch), ${plan.warmup} warm-up`],
    ['Sequence length', `${formatCount(plan.seq_len)} tokens`],
    ['Examples', `${formatCount(plan.examples)}, ${formatCount(plan.validation)} held out for validation`],
    ['Trainable parameters', `${formatCount(plan.trainable_parameters)} in ${formatCount(weights)} adapted weights`],
    ['Estimated peak memory', formatBytes(plan.memory_estimate_bytes) +
      (plan.recompute ? ' (activations recomputed layer by layer)' : '')],
  ];
  if (plan.seconds_estimate != null) rows.push(['Estimated time', formatClock(plan.seconds_estimate)]);
  const fits = plan.memory_available_bytes == null || plan.memory_estimate_bytes <= plan.memory_available_bytes;
  const list = h('dl', {}, ...rows.flatMap(([term, value]) => [h('dt', {}, term), h('dd', {}, value)]));
  const warning = fits ? [] : [h('p', { class: 'error', role: 'alert' },
    `This run needs about ${formatBytes(plan.memory_estimate_bytes)} but ${formatBytes(plan.memory_available_bytes)} ` +
    'is free: it may be stopped by the system. Lower the batch size or the maximum length.')];
  $('plan').replaceChildren(list, ...warning);
}

// ---------- run and progress ----------

function setRunStatus(status, text) {
  setStatus($('run-status'), status, text);
  setStatus($('strip-status'), status, text);
}

function setRunning(running) {
  state.running = running;
  $('cancel-button').textContent = 'Cancel';
  setMessage($('cancel-error'), null);
  updateButtons();
}

function setChart(svg, placeholder = CHART_PLACEHOLDER) {
  if (svg) $('loss-chart').innerHTML = svg; // SVG markup from our own Rust: trusted
  else $('loss-chart').replaceChildren(h('p', { class: 'muted' }, placeholder));
}

function renderSteps(done, total) {
  for (const bar of [$('progress'), $('strip-progress')]) {
    bar.max = Math.max(1, total);
    bar.value = done;
  }
  $('progress-text').textContent = `${done} / ${total} steps`;
}

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

function renderEntryStatus(entry, message) {
  state.statusEntry = entry;
  setRunStatus(entry.status, describeEntry(entry, message));
  renderSteps(entry.steps_done, entry.steps);
  updateButtons();
}

const startRun = () => runInWorker('start_run', { run: runRequest(readSettings().settings) }, true);

/** Continues a run that ended early from its saved state; its chart goes on where it stopped. */
async function resumeRun(id) {
  await openRun(id); // the run's own chart and status, which the resumed steps carry on
  $('log-lines').textContent = '';
  showTab('train');
  return runInWorker('resume_run', { id }, false);
}

/** Starts `command` (start_run or resume_run); its events arrive on a channel. */
async function runInWorker(command, args, fresh) {
  const channel = new tauri.core.Channel();
  channel.onmessage = handleRunEvent;
  if (fresh) resetProgress();
  showResult(null);
  state.statusEntry = null;
  setRunning(true);
  setRunStatus('running', 'Starting…');
  try {
    const entry = await invoke(command, { ...args, onEvent: channel });
    state.viewedId = entry.id;
    refreshHistory();
  } catch (error) {
    setRunning(false);
    setRunStatus('failed', errorText(error));
  }
}

/** The worker's own events arrive wrapped as {kind: "progress", event: …}; the app's as {kind: …}. */
const messageKind = (message) => (message.kind === 'progress' ? message.event : message.kind);

function handleRunEvent(message) {
  switch (messageKind(message)) {
    case 'started': {
      if (!state.running) break; // a late message from a run that already ended
      const where = `${backendLabel(message.backend)} (${message.device})`;
      const text = `Training on ${where}: ${formatCount(message.examples)} examples, ${formatCount(message.validation)} ` +
        `held out, sequence length ${message.seq_len}, est. peak memory ${formatBytes(message.memory_estimate_bytes)}`;
      if ($('run-status').dataset.status === 'running') setRunStatus('running', text);
      renderSteps(message.first_step, message.steps);
      appendLog(`${text}; ${message.steps} steps, ${message.warmup} warm-up`);
      break;
    }
    case 'step':
      renderSteps(message.step, message.total);
      $('step-loss').textContent = `loss ${formatLoss(message.loss)} · lr ${message.lr.toExponential(1)}`;
      $('eta').textContent = formatClock(message.eta_s);
      $('tokens-per-s').textContent = formatCount(Math.round(message.tokens_per_s));
      break;
    case 'epoch': {
      const validation = message.val != null ? `, validation ${formatLoss(message.val)}` : '';
      appendLog(`Epoch ${message.epoch}: loss ${formatLoss(message.loss)}${validation}`);
      break;
    }
    case 'chart':
      setChart(message.svg);
      break;
    case 'log':
      appendLog(message.line);
      break;
    case 'finished':
    case 'failed':
      runEnded(message.entry, message.message);
      break;
  }
}

function runEnded(entry, message) {
  setRunning(false);
  if (entry) {
    state.viewedId = entry.id;
    renderEntryStatus(entry, message);
    showResult(entry);
    badgeTab('evaluate', entry.scores ? '•' : null);
  } else {
    setRunStatus('failed', message ?? 'The run failed.');
  }
  if (message) appendLog(message);
  refreshHistory();
}

async function cancelRun() {
  try {
    const answer = await invoke('cancel_run');
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

// ---------- result and build ----------

function showResult(entry) {
  state.entry = entry;
  $('result').hidden = !entry?.adapter;
  $('result-empty').hidden = Boolean(entry?.adapter);
  renderEvaluation(entry);
  if (!entry?.adapter) return;
  $('adapter-path').textContent = entry.adapter;
  $('cact-path').value = entry.suggested_cact;
  $('build-progress').value = 0;
  setBuildStatus('idle', '');
  setMessage($('result-error'), null);
  renderBuilt(entry.cact);
}

function renderBuilt(cact) {
  $('build-result').hidden = !cact;
  if (!cact) return;
  $('cact-size').textContent = formatBytes(cact.bytes);
  $('cact-tensors').textContent = String(cact.tensors);
  $('cact-scheme').textContent = cact.scheme;
}

const setBuildStatus = (status, text) => setStatus($('build-status'), status, text);

function setBuilding(building) {
  state.building = building;
  updateButtons();
}

async function buildCact() {
  const entry = state.entry;
  const out = $('cact-path').value.trim();
  if (!out) {
    setBuildStatus('failed', 'Choose where to save the .cact file.');
    return;
  }
  const bits = Number(document.querySelector('input[name="bits"]:checked').value);
  const channel = new tauri.core.Channel();
  channel.onmessage = (message) => handleBuildEvent(entry.id, message);
  setBuilding(true);
  setBuildStatus('building', 'Starting the build…');
  $('build-progress').value = 0;
  renderBuilt(null);
  try {
    await invoke('build_cact', { runId: entry.id, bits, out, onEvent: channel });
  } catch (error) {
    setBuilding(false);
    setBuildStatus('failed', errorText(error));
  }
}

function handleBuildEvent(runId, message) {
  const kind = messageKind(message);
  if (kind === 'built' || kind === 'failed') setBuilding(false);
  if (kind === 'built') refreshHistory();
  if (state.entry?.id !== runId) return; // the panel now shows another run
  switch (kind) {
    case 'stage':
      $('build-progress').max = message.of;
      $('build-progress').value = message.index;
      setBuildStatus('building', `${message.label} (${message.index}/${message.of})`);
      break;
    case 'merged':
      setBuildStatus('building', `Merged the adapter into ${message.groups} weight groups`);
      break;
    case 'scoring':
      setBuildStatus('building', 'Answering the held-out examples with the built file…');
      break;
    case 'built':
      state.entry = { ...message.entry, cact: message.cact };
      $('build-progress').value = $('build-progress').max;
      setBuildStatus('built', `Built ${basename(message.cact.path)}`);
      renderBuilt(message.cact);
      renderEvaluation(state.entry);
      badgeTab('evaluate', message.cact.scores ? '•' : null);
      break;
    case 'failed':
      setBuildStatus('failed', message.message);
      break;
  }
}

// ---------- evaluate ----------

const percent = (rate) => `${(100 * rate).toFixed(0)}%`;

/** The held-out scores of a run: base, tuned and (once built) the .cact, with a warning when the
 *  file answers markedly worse than the tuned model it was built from. */
function renderEvaluation(entry) {
  const scores = entry?.scores;
  const cact = entry?.cact?.scores;
  $('evaluation-table').hidden = !scores;
  $('evaluation-empty').hidden = Boolean(scores);
  const rows = scores ? [['Base', scores.base], ['Tuned', scores.tuned]] : [];
  if (scores && cact) rows.push([`.cact (${entry.cact.scheme})`, cact]);
  $('evaluation-rows').replaceChildren(...rows.map(([name, score]) => h('tr', {},
    h('th', { scope: 'row' }, name),
    h('td', {}, formatLoss(score.loss)),
    h('td', {}, `${score.calls.exact} / ${score.calls.examples} (${percent(score.calls.exact_rate)})`),
    h('td', {}, percent(score.calls.parse_rate)))));
  const worse = scores && cact && (cact.calls.exact_rate < scores.tuned.calls.exact_rate - 0.1 || cact.loss > scores.tuned.loss * 1.1);
  setMessage($('evaluation-warning'), worse &&
    `The .cact answers markedly worse than the tuned model (${percent(cact.calls.exact_rate)} exact calls against ` +
    `${percent(scores.tuned.calls.exact_rate)}, loss ${formatLoss(cact.loss)} against ${formatLoss(scores.tuned.loss)}): ` +
    'quantization costs this model accuracy. Build it at 4 bits rather than 2, or check it with Try before shipping.');
  const examples = scores ? scores.base.calls.examples : 0;
  $('evaluation-note').textContent = !scores ? ''
    : `${examples} held-out example(s), answered by greedy decoding; a call counts when it equals the expected one exactly.` +
      (entry.cact && !cact ? ` The .cact was not scored${entry.cact.scores_error ? `: ${entry.cact.scores_error}` : ''}.` : '') +
      (!entry.cact ? ' Build the .cact (Export) to score it too.' : '');
}

/** Prefills the Try panel from a dataset sample (once: the user's own edits are kept). */
function prefillTry(sample) {
  if (!sample || $('try-tools').value.trim()) return;
  let tools = sample.tools;
  try {
    tools = JSON.stringify(JSON.parse(sample.tools), null, 1);
  } catch {
    // Shown as written: asking will say what is wrong with it.
  }
  $('try-tools').value = tools;
  $('try-query').value = sample.query;
}

function renderAnswer(id, answer) {
  const body = $(id).querySelector('.answer-body');
  if (!answer) {
    body.replaceChildren('No tuned model yet: train a run or open one from History.');
    return;
  }
  const calls = answer.calls == null ? h('p', { class: 'verdict', 'data-ok': 'false' }, 'No parseable call')
    : h('pre', {}, answer.calls.length ? answer.calls.map((c) => JSON.stringify(c)).join('\n') : '(no call)');
  body.className = 'answer-body';
  // The whole answer is open when no call could be read from it: that is what to look at.
  const open = answer.calls == null ? { open: '' } : {};
  const cut = {
    max_length: "The answer was cut: the prompt and answer filled the model's context (max_seq_len).",
    max_new_tokens: 'The answer was cut at the most new tokens a try may take.',
  }[answer.stop];
  body.replaceChildren(calls, h('details', open, h('summary', { class: 'small muted' }, 'Full answer'), h('pre', {}, answer.text)),
    ...(cut ? [h('p', { class: 'warning small' }, cut)] : []),
    h('div', { class: 'small muted' }, `${answer.tokens_per_s.toFixed(0)} tokens/s`));
}

async function askModels() {
  const entry = state.entry?.adapter ? state.entry : null;
  const question = { run_id: entry?.id ?? null, tools: $('try-tools').value, query: $('try-query').value };
  $('try-button').disabled = true;
  $('try-status').textContent = entry ? 'The base and the tuned model are answering…' : 'The base model is answering…';
  setMessage($('try-error'), null);
  try {
    const answers = await invoke('try_model', { question });
    renderAnswer('try-base', answers.base);
    renderAnswer('try-tuned', answers.tuned);
    $('try-status').textContent = '';
  } catch (error) {
    setMessage($('try-error'), error);
    $('try-status').textContent = '';
  } finally {
    $('try-button').disabled = false;
  }
}

// ---------- history ----------

function renderHistory(entries) {
  const sorted = [...entries].sort((a, b) => b.started_at - a.started_at);
  $('history-empty').hidden = sorted.length > 0;
  $('history-list').replaceChildren(...sorted.map(historyItem));
  updateButtons();
}

function historyItem(entry) {
  const button = h('button', { type: 'button', class: 'history-item', 'data-id': entry.id },
    h('span', {}, formatDate(entry.started_at)),
    h('span', { class: 'path' }, basename(entry.dataset)),
    h('span', { class: 'status-text', 'data-status': entry.status }, entry.status),
    h('span', {}, entry.final_loss != null ? `loss ${formatLoss(entry.final_loss)}` : '–'));
  if (entry.id === state.viewedId) button.setAttribute('aria-current', 'true');
  button.addEventListener('click', () => openRun(entry.id));
  if (!entry.resumable) return h('li', {}, button);
  const resume = h('button', { type: 'button', class: 'history-resume', 'data-id': entry.id }, 'Resume');
  resume.addEventListener('click', () => resumeRun(entry.id));
  return h('li', {}, button, resume);
}

async function refreshHistory() {
  try {
    renderHistory(await invoke('history'));
    setMessage($('history-error'), null);
  } catch (error) {
    setMessage($('history-error'), error);
  }
}

async function openRun(id) {
  try {
    const { entry, chart } = await invoke('open_run', { id });
    state.viewedId = id;
    fillFields(entry.settings);
    runInputsChanged();
    setChart(chart, 'No loss chart was recorded for this run.');
    renderEntryStatus(entry);
    showResult(entry);
    showTab('evaluate');
    for (const item of document.querySelectorAll('.history-item')) {
      if (item.dataset.id === id) item.setAttribute('aria-current', 'true');
      else item.removeAttribute('aria-current');
    }
    setMessage($('history-error'), null);
  } catch (error) {
    setMessage($('history-error'), error);
  }
}

// ---------- start-up ----------

function wireControls() {
  $('device-select').addEventListener('change', () => {
    saveSettings();
    runInputsChanged();
  });
  $('drop-zone').addEventListener('click', chooseDataset);
  $('dataset-choose').addEventListener('click', chooseDataset);
  wireModelPath('checkpoint', 'Needle checkpoint', 'pkl');
  wireModelPath('tokenizer', 'SentencePiece tokenizer', 'model');
  $('hub-download').addEventListener('click', downloadBaseModel);
  $('hub-cancel').addEventListener('click', cancelDownload);
  $('hub-use').addEventListener('click', () => state.hub?.cached && useBaseModel(state.hub.cached));
  for (const button of document.querySelectorAll('.preset')) {
    button.addEventListener('click', () => applyPreset(button.dataset.preset));
  }
  for (const field of FIELDS) {
    $(`field-${field}`).addEventListener('input', () => {
      runInputsChanged();
      if (field === 'max_len') scheduleDatasetReload();
    });
  }
  $('plan-button').addEventListener('click', checkPlan);
  $('start-button').addEventListener('click', startRun);
  $('cancel-button').addEventListener('click', cancelRun);
  $('resume-button').addEventListener('click', () => state.statusEntry && resumeRun(state.statusEntry.id));
  $('adapter-reveal').addEventListener('click', () => reveal(state.entry.adapter, $('result-error')));
  $('reveal-button').addEventListener('click', () => reveal(state.entry.cact.path, $('result-error')));
  $('cact-choose').addEventListener('click', async () => {
    const current = $('cact-path').value.trim();
    const path = await pickPath({ name: 'Needle model', ext: 'cact', current, errorEl: $('result-error'), save: true });
    if (path) $('cact-path').value = path;
  });
  $('build-button').addEventListener('click', buildCact);
  $('try-button').addEventListener('click', askModels);
  for (const tab of document.querySelectorAll('.steps [role="tab"]')) {
    tab.addEventListener('click', () => {
      showTab(tab.dataset.tab);
      badgeTab(tab.dataset.tab, null);
    });
  }
  tauri.webview.getCurrentWebview().onDragDropEvent(handleDragDrop)
    .catch((error) => setMessage($('dataset-error'), `Drag and drop is unavailable: ${errorText(error)}`));
}

async function init() {
  if (!tauri) {
    setMessage($('app-error'), 'Needle Studio must run inside its desktop app: the Tauri runtime is missing.');
    return;
  }
  wireControls();
  try {
    const startup = await invoke('startup');
    state.presets = startup.presets;
    state.preset = startup.settings.preset;
    renderHardware(startup.hardware, startup.devices, startup.settings.device);
    $('checkpoint-path').value = startup.settings.checkpoint ?? '';
    $('tokenizer-path').value = startup.settings.tokenizer ?? '';
    // A first start has no base model yet: that is the first step. Otherwise start with the data.
    showTab(startup.settings.checkpoint ? 'data' : 'model');
    const preset = startup.presets.find((p) => p.name === state.preset) ?? startup.presets[0];
    if (preset) fillFields(preset.settings);
    runInputsChanged();
    renderHistory(startup.history);
    if (startup.dataset) loadDataset(startup.dataset);
    refreshHub();
  } catch (error) {
    setMessage($('app-error'), `Could not start: ${errorText(error)}`);
  }
}

init();
