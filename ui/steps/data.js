// @ts-check
// The Data step: choose or drop a .jsonl file, and show the report the worker makes of it, with the
// doctor's findings beside it (each line a button that shows the file's line); and Generate, more
// examples from an LLM (count, model, endpoint and the key, then the worker's progress, Cancel, and
// the new rows), whose written file becomes the dataset, and when asked an acceptance suite for the
// same tools, which Evaluate is told of. The app checks the request and says what is missing.

import * as api from '../ground/api.js';
import { resetCancel, wireCancel } from '../ground/cancel.js';
import { $, debounce, errorText, formatCount, h, setMessage, setStatus } from '../ground/dom.js';
import { pickPath } from '../ground/files.js';
import { renderKey, wireKey } from '../ground/keys.js';
import { hear, state, tell } from '../ground/state.js';

/** @typedef {import('../ground/api.js').DragDrop} DragDrop */
/** @typedef {import('../ground/types.js').Checkup} Checkup */
/** @typedef {import('../ground/types.js').RowCategory} RowCategory */
/** @typedef {import('../ground/types.js').DatasetReport} DatasetReport */
/** @typedef {import('../ground/types.js').GenerateMessage} GenerateMessage */
/** @typedef {import('../ground/types.js').GenerationState} GenerationState */
/** @typedef {import('../ground/types.js').Outcome} Outcome */
/** @typedef {import('../ground/types.js').SuiteWritten} SuiteWritten */
/** @typedef {import('../ground/types.js').Sample} Sample */
/** @typedef {import('../ground/types.js').Written} Written */

// ---------- the dataset's report ----------

let datasetSeq = 0;
/** @param {string} path */
export async function loadDataset(path) {
  const seq = ++datasetSeq;
  state.dataset = path;
  $('dataset-path').textContent = path;
  $('dataset-path').classList.remove('muted');
  setMessage($('dataset-error'), null);
  tell('inputs', null);
  try {
    const { tokenizer, checkpoint } = state.model;
    const report = await api.loadDataset(path, tokenizer || null, checkpoint || null, state.settings.max_len ?? '');
    if (seq === datasetSeq) renderReport(report);
  } catch (error) {
    if (seq !== datasetSeq) return;
    $('dataset-report').hidden = true;
    setMessage($('dataset-error'), error);
  }
}

/** Reads the chosen dataset again (its report depends on the tokenizer and the max length). */
const scheduleDatasetReload = debounce(() => state.dataset && loadDataset(state.dataset), 300);

async function chooseDataset() {
  const errorEl = $('dataset-error');
  const path = await pickPath({ name: 'JSONL dataset', ext: 'jsonl', current: state.dataset, errorEl });
  if (path) loadDataset(path);
}

/** @param {string} path */
const isSuite = (path) => path.toLowerCase().endsWith('.json');

/** @param {DragDrop} payload */
function handleDragDrop(payload) {
  $('drop-zone').classList.toggle('dragging', payload.type === 'enter' || payload.type === 'over');
  if (payload.type !== 'drop') return;
  const path = (payload.paths ?? []).find((p) => p.toLowerCase().endsWith('.jsonl'));
  if (path) loadDataset(path);
  // A .json file is an acceptance suite: Evaluate takes it.
  else if (!(payload.paths ?? []).some(isSuite)) {
    setMessage($('dataset-error'), 'That is not a .jsonl file: drop a file with one JSON example per line.');
  }
}

/** @param {DatasetReport} report */
function renderReport(report) {
  $('dataset-report').hidden = false;
  tell('report', report);
  $('report-examples').textContent = String(report.usable_examples); // plain numbers where tests read them
  $('report-skipped').textContent = String(report.skipped_lines);
  const lengths = report.token_lengths;
  $('report-lengths').textContent = `${lengths.min} / ${lengths.median} / ${lengths.max}`;
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
  renderDoctor(report.doctor);
}

/** How many of a finding's lines get a button (the message counts them all). */
const LINE_BUTTONS = 12;

/** @param {Checkup} doctor */
function renderDoctor(doctor) {
  $('doctor-summary').textContent = doctor.summary;
  $('doctor-line-box').hidden = true;
  $('doctor-findings').replaceChildren(
    ...doctor.findings.map((finding) => {
      const buttons = finding.lines.slice(0, LINE_BUTTONS).map((line) =>
        h('button', { type: 'button', class: 'line-link', 'data-line': String(line), 'aria-pressed': 'false',
          title: `Show line ${line}` }, String(line)));
      const more = finding.count - buttons.length;
      return h('li', { 'data-kind': finding.kind },
        h('span', { class: 'tag', 'data-severity': finding.severity }, finding.severity), finding.message,
        buttons.length ? h('div', { class: 'lines' }, ...buttons,
          more > 0 && finding.kind !== 'few_examples' ? h('span', { class: 'muted small' }, `+${formatCount(more)}`) : null)
          : null);
    }),
    ...(doctor.unlisted_findings > 0 ? [h('li', { class: 'muted' }, `… and ${formatCount(doctor.unlisted_findings)} more`)] : []),
  );
  const tools = Object.entries(doctor.calls_per_tool).map(([tool, n]) => `${tool} ${formatCount(n)}`);
  if (doctor.unlisted_tools > 0) tools.push(`… and ${formatCount(doctor.unlisted_tools)} more tools`);
  // A row with no call does not say why (a value missing, negated, invalid, no tool fits): one category.
  const categories = doctor.categories.map(({ category, rows, share }) =>
    `${formatCount(rows)} ${CATEGORY_NAMES[category]} (${Math.round(100 * share)}%)`);
  $('doctor-tools').textContent = `Calls per tool: ${tools.join(', ') || 'none'} · ` +
    `Rows: ${categories.join(', ')} of ${formatCount(doctor.rows)}`;
}

/** @type {Record<RowCategory, string>} */
const CATEGORY_NAMES = { positive: 'one call', parallel: 'parallel calls', no_call: 'no call' };

let lineSeq = 0;
/** Shows line `line` of the dataset as it is written. @param {number} line */
async function showLine(line) {
  const path = state.dataset;
  if (!path) return;
  const seq = ++lineSeq;
  for (const button of document.querySelectorAll('#doctor-findings .line-link')) {
    button.setAttribute('aria-pressed', String(/** @type {HTMLElement} */ (button).dataset.line === String(line)));
  }
  $('doctor-line-box').hidden = false;
  $('doctor-line-title').textContent = `Line ${line}`;
  try {
    const text = await api.datasetLine(path, line);
    if (seq === lineSeq) $('doctor-line').textContent = text;
  } catch (error) {
    if (seq === lineSeq) $('doctor-line').textContent = errorText(error);
  }
}

/** @param {DatasetReport['histogram']} bins */
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

/**
 * The first problems word for word (the report keeps at most a hundred), then counts of the rest.
 * @param {DatasetReport} report
 */
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

/** @param {Sample[]} samples */
function renderSamples(samples) {
  $('report-samples').replaceChildren(
    ...samples.map((sample) =>
      h('div', { class: 'sample' },
        h('div', { class: 'muted small' }, `Line ${sample.line} · ${formatCount(sample.tokens)} tokens`),
        h('div', { class: 'label' }, 'Prompt'), h('pre', {}, sample.prompt),
        h('div', { class: 'label' }, 'Target'), h('pre', {}, sample.target))),
  );
}

function wireDataset() {
  $('doctor-findings').addEventListener('click', (/** @type {MouseEvent} */ event) => {
    const button = event.target instanceof Element ? event.target.closest('.line-link') : null;
    if (button instanceof HTMLElement) showLine(Number(button.dataset.line));
  });
  $('drop-zone').addEventListener('click', chooseDataset);
  $('dataset-choose').addEventListener('click', chooseDataset);
  api.onDragDrop(handleDragDrop)
    .catch((error) => setMessage($('dataset-error'), `Drag and drop is unavailable: ${errorText(error)}`));
  hear('reportInputs', scheduleDatasetReload);
}

// ---------- Generate ----------

/** @param {boolean} running */
function setGenerating(running) {
  $('generate-button').disabled = running;
  $('generate-cancel').disabled = !running;
  resetCancel($('generate-cancel'));
}

/** @param {Record<string, number>} counts */
const byReason = (counts) =>
  Object.entries(counts).map(([reason, n]) => `${formatCount(n)} ${reason.replaceAll('_', ' ')}`).join(', ');

/** @param {GenerationState} generation */
function renderState(generation) {
  const status = $('generate-status');
  switch (generation.state) {
    case 'idle':
      setStatus(status, 'idle', '');
      break;
    case 'running': {
      // The rows first, then the suite's cases, when one was asked for.
      const { suite } = generation;
      const [done, wanted] = suite ? [suite.cases, suite.wanted] : [generation.generated, generation.wanted];
      $('generate-progress').max = Math.max(1, wanted);
      $('generate-progress').value = done;
      const parts = [`${formatCount(done)} of ${formatCount(wanted)} ${suite ? 'suite cases' : 'new rows'}`];
      const { failed_requests: failed, rejected } = suite ?? generation;
      if (failed) parts.push(`${formatCount(failed)} failed request(s)`);
      if (byReason(rejected)) parts.push(`not kept: ${byReason(rejected)}`);
      const doing = generation.stopping ? 'Stopping: writing what arrived' : suite ? 'Writing the suite' : 'Generating';
      setStatus(status, generation.stopping ? 'stopping' : 'running', `${doing} · ${parts.join(' · ')}`);
      break;
    }
    case 'written':
      renderOutcome(generation);
      break;
    case 'failed':
      setStatus(status, 'failed', generation.message);
      break;
  }
}

/** What was written: the rows, the suite, or both, and why a suite asked for was not. @param {Outcome} outcome */
function renderOutcome({ data, suite, suite_failed: suiteFailed }) {
  const said = [data && rowsWritten(data), suite && suiteWritten(suite), suiteFailed && `No suite: ${suiteFailed}`];
  setStatus($('generate-status'), 'written', said.filter(Boolean).join('. '));
  $('generate-progress').max = Math.max(1, data ? data.wanted : suite?.cases ?? 0);
  $('generate-progress').value = data ? data.generated : suite?.cases ?? 0;
  // Each new row as written: a JSON object with its query and answers, shown as they are.
  const rows = /** @type {{query?: unknown, answers?: unknown}[]} */ (data?.rows ?? []);
  $('generate-rows').replaceChildren(...rows.map((row) =>
    h('li', {}, String(row.query ?? ''), h('code', {}, JSON.stringify(row.answers ?? [])))));
}

/** @param {Written} written */
function rowsWritten(written) {
  const cut = written.cancelled ? ' (cancelled: what arrived is kept)' : '';
  const notes = [byReason(written.rejected) && `not kept: ${byReason(written.rejected)}`,
    byReason(written.advice) && `kept with advice: ${byReason(written.advice)}`].filter(Boolean);
  return `${formatCount(written.generated)} new rows${cut}; ${formatCount(written.written)} in ${written.path}` +
    (notes.length ? ` · ${notes.join(' · ')}` : '');
}

/** The suite's cases per category against those asked for. @param {SuiteWritten} suite */
function suiteWritten(suite) {
  const cut = suite.cancelled ? ' (cancelled: the cases that arrived are kept)' : '';
  const per = Object.entries(suite.wanted).filter(([, wanted]) => wanted > 0)
    .map(([category, wanted]) => `${suite.written[category] ?? 0}/${wanted} ${category}`).join(', ');
  const notes = [per, byReason(suite.rejected) && `not kept: ${byReason(suite.rejected)}`,
    suite.failed_requests && `${formatCount(suite.failed_requests)} failed request(s)`].filter(Boolean);
  return `Acceptance suite: ${formatCount(suite.cases)} cases${cut} in ${suite.path}, offered in Evaluate · ` +
    notes.join(' · ');
}

/** @param {GenerateMessage} message */
function handleGenerateEvent(message) {
  switch (message.kind) {
    case 'progress':
      renderState(message.state);
      break;
    case 'request_failed':
      setMessage($('generate-failure'), `A request failed: ${message.message}`);
      break;
    case 'finished':
      setGenerating(false);
      renderState(message.state);
      if (message.state.state !== 'written') break;
      // The written file is the dataset from now on: its report is read again.
      if (message.state.data) loadDataset(message.state.data.path);
      if (message.state.suite) tell('suite', message.state.suite.path);
      break;
  }
}

async function generate() {
  setMessage($('generate-error'), null);
  setMessage($('generate-failure'), null);
  $('generate-rows').replaceChildren();
  $('generate-progress').value = 0;
  setGenerating(true);
  setStatus($('generate-status'), 'running', 'Asking the endpoint…');
  const request = {
    dataset: state.dataset ?? '',
    output: $('generate-output').value.trim(),
    count: $('generate-count').value,
    model: $('generate-model').value,
    endpoint: $('generate-endpoint').value,
    negative_share: $('generate-negative-share').value,
    suite: $('generate-suite').checked,
    suite_path: $('generate-suite-path').value.trim(),
    suite_cases: $('generate-suite-cases').value,
  };
  try {
    await api.generateExamples(request, handleGenerateEvent);
  } catch (error) {
    setGenerating(false);
    setStatus($('generate-status'), 'idle', '');
    setMessage($('generate-error'), error);
  }
}

/** Fills the form with the defaults the app gives, the key's source and the last generation. */
export async function showGenerateSetup() {
  try {
    const setup = await api.generateSetup();
    $('generate-count').value = String(setup.count);
    $('generate-suite-cases').value = String(setup.suite_cases);
    $('generate-model').value = setup.model;
    $('generate-endpoint').placeholder = setup.endpoint;
    renderKey('generate-key', setup.key);
    renderState(setup.state);
    setGenerating(setup.state.state === 'running');
  } catch (error) {
    setMessage($('generate-error'), `Generation is unavailable: ${errorText(error)}`);
  }
}

function wireGenerate() {
  const errorEl = $('generate-error');
  $('generate-button').addEventListener('click', generate);
  wireCancel($('generate-cancel'), {
    cancel: api.cancelGeneration,
    stopping: 'Stopping: writing what arrived…',
    say: (text) => setStatus($('generate-status'), 'stopping', text),
    failed: (error) => setMessage(errorEl, error),
  });
  wireKey('generate-key', 'generate_key', errorEl);
  $('generate-output-choose').addEventListener('click', async () => {
    const current = $('generate-output').value.trim() || state.dataset;
    const path = await pickPath({ name: 'JSONL dataset', ext: 'jsonl', current, errorEl, save: true });
    if (path) $('generate-output').value = path;
  });
  $('generate-suite').addEventListener('change', () => {
    $('generate-suite-fields').hidden = !$('generate-suite').checked;
  });
  $('generate-suite-choose').addEventListener('click', async () => {
    const current = $('generate-suite-path').value.trim() || $('generate-output').value.trim() || state.dataset;
    const path = await pickPath({ name: 'Acceptance suite', ext: 'json', current, errorEl, save: true });
    if (path) $('generate-suite-path').value = path;
  });
  setGenerating(false);
}

export function wireData() {
  wireDataset();
  wireGenerate();
}
