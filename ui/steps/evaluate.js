// @ts-check
// The Evaluate step: the held-out scores of the training shown (base and tuned; the tuned model float,
// with its quantization simulated and as the built .cact; per tool, by kind of answer), how far each
// model's confidence can be relied on with the threshold it ships with, an acceptance suite run on the
// three models, and Try (one question to the base and the tuned model, side by side).

import * as api from '../ground/api.js';
import { pickPath } from '../ground/files.js';
import { $, basename, formatLoss, h, percent, setMessage } from '../ground/dom.js';
import { hear, state, tell } from '../ground/state.js';
import { showTab } from '../ground/tabs.js';

/** @typedef {import('../ground/types.js').Answered} Answered */
/** @typedef {import('../ground/types.js').AnswerKind} AnswerKind */
/** @typedef {import('../ground/types.js').KindKey} KindKey */
/** @typedef {import('../ground/types.js').Verdict} Verdict */
/** @typedef {import('../ground/types.js').DatasetReport} DatasetReport */
/** @typedef {import('../ground/types.js').HistoryEntry} HistoryEntry */
/** @typedef {import('../ground/types.js').ModelScore} ModelScore */
/** @typedef {import('../ground/types.js').TryAnswer} TryAnswer */
/** @typedef {import('../ground/types.js').ConfidenceView} ConfidenceView */
/** @typedef {import('../ground/types.js').Acceptance} Acceptance */
/** @typedef {import('../ground/types.js').Call} Call */
/** @typedef {import('../ground/api.js').DragDrop} DragDrop */

/**
 * One model's scores as a table row.
 * @param {string} name @param {ModelScore} score
 */
const scoreRow = (name, score) => h('tr', {},
  h('th', { scope: 'row' }, name),
  h('td', {}, formatLoss(score.loss)),
  h('td', {}, `${score.calls.exact} / ${score.calls.examples} (${percent(score.calls.exact_rate)})`),
  h('td', {}, percent(score.calls.parse_rate)));

/**
 * The held-out scores of a training: base and tuned; once the .cact is built, the tuned model three
 * ways (float, quantization simulated, the file), with a warning when the file answers markedly worse
 * than the float model; then, drawn by the app, why the answers are wrong.
 * @param {HistoryEntry|null} entry
 */
function renderEvaluation(entry) {
  const scores = entry?.scores;
  const rows = entry?.cact?.rows;
  $('evaluation-table').hidden = !scores;
  $('evaluation-empty').hidden = Boolean(scores);
  $('evaluation-rows').replaceChildren(...(scores ? [scoreRow('Base', scores.base), scoreRow('Tuned', scores.tuned)] : []));
  $('quant').hidden = !rows;
  $('quant-rows').replaceChildren(...(rows ? [scoreRow('Float', rows.float),
    scoreRow('Quantization simulated', rows.simulated), scoreRow(`.cact (${entry?.cact?.scheme}): the file's codes, run as W4A8 by Needle Studio`, rows.cact)] : []));
  const worse = rows &&
    (rows.cact.calls.exact_rate < rows.float.calls.exact_rate - 0.1 || rows.cact.loss > rows.float.loss * 1.1);
  setMessage($('evaluation-warning'), worse &&
    `The .cact answers markedly worse than the tuned model (${percent(rows.cact.calls.exact_rate)} exact calls against ` +
    `${percent(rows.float.calls.exact_rate)}, loss ${formatLoss(rows.cact.loss)} against ${formatLoss(rows.float.loss)}): ` +
    'quantization costs this model accuracy. ' +
    (/^W2/.test(entry?.cact?.scheme ?? '') ? 'Build it at 4 bits rather than 2, or check' : 'Check') +
    ' it with Try before shipping.');
  $('evaluation-note').textContent = scores && entry ? evaluationNote(entry, scores.base.calls.examples) : '';
  setMessage($('evaluation-advice'), scores && entry && parseAdvice(entry, scores.base, scores.tuned));
  /** @type {[string, ModelScore][]} */
  const models = scores ? [['Base', scores.base], ['Tuned', scores.tuned]] : [];
  if (rows) models.push(['Quantization simulated', rows.simulated], ['.cact', rows.cact]);
  $('quant-gaps').textContent = '';
  $('breakdown').hidden = true;
  $('confidence').hidden = true;
  $('evaluation-wrong').replaceChildren();
  renderAcceptance(entry?.acceptance ?? null);
  if (entry && scores) renderBreakdown(entry.id, models);
}

/**
 * The app's drawing and words for training `id`: a chart per tool, their legend, the three rows'
 * gaps; then each model's wrong answers grouped by kind, in the legend's names and colours.
 * @param {string} id @param {[string, ModelScore][]} models
 */
async function renderBreakdown(id, models) {
  let evaluation;
  try {
    evaluation = await api.evaluation(id);
    setMessage($('breakdown-error'), null);
  } catch (error) {
    setMessage($('breakdown-error'), error);
    return;
  }
  if (state.entry?.id !== id) return; // another training is shown by now
  $('quant-gaps').textContent = evaluation.gaps ?? '';
  $('breakdown').hidden = evaluation.charts.length === 0;
  $('breakdown-kinds').replaceChildren(...evaluation.kinds.map(({ label, color }) =>
    h('li', {}, h('span', { class: 'swatch', style: `background: ${color}` }), label)));
  $('breakdown-charts').replaceChildren(...evaluation.charts.map(({ tool, svg }) => {
    const drawing = h('div', {});
    drawing.innerHTML = svg; // SVG markup from our own Rust: trusted
    return h('figure', { 'data-tool': tool }, h('figcaption', {}, tool), drawing);
  }));
  renderConfidence(evaluation.confidence ?? null);
  const keys = new Map(evaluation.kinds.map((key) => [key.kind, key]));
  $('evaluation-wrong').replaceChildren(...models
    .filter(([, score]) => score.wrong?.length)
    .map(([name, score]) => wrongAnswers(name, score.wrong ?? [], keys)));
}

/** The confidence the window shows: the models' figures, and the threshold as Rust last said it. */
/** @type {ConfidenceView|null} */
let shownConfidence = null;

/**
 * The reliability chart, each model's AUROC and ECE, and the threshold control with what a gate there
 * keeps and stops for each model.
 * @param {ConfidenceView|null} view
 */
function renderConfidence(view) {
  shownConfidence = view;
  $('confidence').hidden = !view;
  if (!view) return;
  $('reliability-chart').innerHTML = view.chart; // SVG markup from our own Rust: trusted
  const range = $('threshold-range');
  range.value = String(view.threshold);
  renderTradeoff(view.threshold);
}

/**
 * Each model's row at `threshold` (the trade-off tables' nearest threshold), and what is saved where.
 * @param {number} threshold
 */
function renderTradeoff(threshold) {
  const view = shownConfidence;
  if (!view) return;
  const figure = (/** @type {number|null|undefined} */ x) => (x == null ? '–' : x.toFixed(2));
  const share = (/** @type {number|null|undefined} */ x) => (x == null ? '–' : percent(x));
  /** @param {{low: number, high: number}|null|undefined} interval */
  const within = (interval) => (interval ? ` (${figure(interval.low)}–${figure(interval.high)})` : '');
  $('threshold-value').textContent = threshold.toFixed(2);
  $('confidence-rows').replaceChildren(...view.models.map(({ model, figures }) => {
    const row = figures.tradeoff[Math.round(threshold * (figures.tradeoff.length - 1))];
    return h('tr', { 'data-model': model },
      h('th', { scope: 'row' }, model),
      h('td', {}, `${figure(figures.auroc)}${within(figures.auroc_interval)}`),
      h('td', {}, `${figure(figures.ece)}${within(figures.ece_interval)}`),
      h('td', {}, share(row?.kept_right)),
      h('td', {}, share(row?.stopped_wrong)));
  }));
  const picked = threshold === view.threshold && view.picked;
  $('threshold-note').textContent = (picked ? `The model ships with a threshold of ${threshold.toFixed(2)}` :
    `Proposed: ${view.threshold.toFixed(2)}, the highest that stops at most 10% of right answers; move the control to pick another`) +
    (view.file ? `. It is written beside the .cact, in ${basename(view.file)}.` : '. Once the .cact is built, it is written beside it.');
}

/** The threshold picked: kept with the training (and beside its .cact) in Rust, then shown as Rust says it. */
async function pickThreshold() {
  const entry = state.entry;
  if (!entry) return;
  const threshold = Number($('threshold-range').value);
  try {
    const updated = await api.pickThreshold(entry.id, threshold);
    setMessage($('threshold-error'), null);
    if (state.entry?.id !== updated.id) return;
    state.entry = updated;
    if (shownConfidence) shownConfidence = { ...shownConfidence, threshold, picked: true };
    renderTradeoff(threshold);
    tell('history', null);
  } catch (error) {
    setMessage($('threshold-error'), error);
  }
}

/** @param {Call[]} calls */
const callsText = (calls) => (calls.length ? json(calls) : 'no call');

/**
 * The last acceptance run: the verdict per model, each category's passes side by side, and the
 * critical cases failed with the answer given.
 * @param {Acceptance|null} acceptance
 */
function renderAcceptance(acceptance) {
  $('acceptance-result').hidden = !acceptance;
  if (!acceptance) return;
  if (!$('suite-path').value) $('suite-path').value = acceptance.suite;
  const models = acceptance.models;
  const verdict = $('acceptance-verdict');
  const shipped = models[models.length - 1];
  verdict.dataset.ok = String(Boolean(shipped?.contract));
  verdict.textContent = `${acceptance.name}, threshold ${acceptance.min_confidence.toFixed(2)}: ` + models.map((m) =>
    `${m.model} ${m.contract ? 'PASS' : 'FAIL'} (${m.passed}/${m.total}, needs ${m.required}; ${m.critical_failures} critical failed)`).join(' · ');
  $('acceptance-head').replaceChildren(h('tr', {}, h('th', { scope: 'col' }, 'Category'),
    ...models.map((m) => h('th', { scope: 'col' }, m.model))));
  const categories = [...new Set(models.flatMap((m) => m.categories.map((c) => c.category)))];
  $('acceptance-rows').replaceChildren(
    ...categories.map((category) => h('tr', {}, h('th', { scope: 'row' }, category), ...models.map((m) => {
      const score = m.categories.find((c) => c.category === category);
      return h('td', {}, score ? `${score.passed} / ${score.total}` : '–');
    }))),
    h('tr', { class: 'contract' }, h('th', { scope: 'row' }, 'Contract'),
      ...models.map((m) => h('td', { 'data-ok': String(m.contract) }, m.contract ? 'PASS' : 'FAIL'))));
  $('acceptance-critical').replaceChildren(...models.filter((m) => m.critical.length).map((m) =>
    h('details', { class: 'wrong-answers' }, h('summary', {}, `${m.model}: ${m.critical.length} critical case(s) failed`),
      h('table', { class: 'scores' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Category'), h('th', {}, 'Query'), h('th', {}, 'Expected'),
          h('th', {}, 'Acted on'), h('th', {}, 'Confidence'))),
        h('tbody', {}, ...m.critical.map((c) => h('tr', {},
          h('td', {}, c.category),
          h('td', {}, c.query),
          h('td', {}, h('code', {}, callsText(c.expected))),
          h('td', { title: c.text }, h('code', {}, c.reason ?? callsText(c.calls))),
          h('td', {}, c.confidence == null ? '–' : c.confidence.toFixed(2)))))))));
}

async function runAcceptance() {
  const entry = state.entry;
  if (!entry) {
    setMessage($('acceptance-error'), 'Start a training or open one from History first.');
    return;
  }
  $('acceptance-button').disabled = true;
  $('acceptance-status').textContent = 'The base, the tuned model and the .cact are answering the suite…';
  setMessage($('acceptance-error'), null);
  try {
    const updated = await api.runAcceptance(entry.id, $('suite-path').value.trim());
    if (state.entry?.id === updated.id) {
      state.entry = updated;
      renderAcceptance(updated.acceptance ?? null);
    }
    tell('history', null);
  } catch (error) {
    setMessage($('acceptance-error'), error);
  } finally {
    $('acceptance-status').textContent = '';
    $('acceptance-button').disabled = false;
  }
}

async function chooseSuite() {
  const errorEl = $('acceptance-error');
  const path = await pickPath({ name: 'Acceptance suite', ext: 'json', current: $('suite-path').value || null, errorEl });
  if (path) $('suite-path').value = path;
}

/**
 * A suite just generated (Data's Generate) is the one the Acceptance section offers next, as a
 * dropped one is.
 * @param {string} path
 */
function offerSuite(path) {
  $('suite-path').value = path;
  setMessage($('acceptance-error'), null);
}

/**
 * A suite file dropped on the window goes to the Acceptance section.
 * @param {DragDrop} payload
 */
function takeDroppedSuite(payload) {
  const path = payload.type === 'drop' && (payload.paths ?? []).find((p) => p.toLowerCase().endsWith('.json'));
  if (!path) return;
  offerSuite(path);
  showTab('evaluate');
}

/**
 * Why a tuned model's answers may parse less often than its base's, in one line; null when they do not.
 * @param {HistoryEntry} entry @param {ModelScore} base @param {ModelScore} tuned
 */
function parseAdvice(entry, base, tuned) {
  if (tuned.calls.parse_rate >= base.calls.parse_rate) return null;
  const { epochs, lr } = entry.request.settings;
  return `The tuned model's answers parse less often than the base's (${percent(tuned.calls.parse_rate)} against ` +
    `${percent(base.calls.parse_rate)}): it has learned the examples' wording but not yet the call format. ` +
    `The usual causes are too few examples (add more, or have \`needle generate-data --augment\` write them), ` +
    `a learning rate too high for them ` +
    `(this training: ${lr}; try half) or too many epochs (this training: ${epochs}).`;
}

/** @param {unknown} value */
const json = (value) => JSON.stringify(value);

/**
 * What differs in a wrong answer, the expected and the given side highlighted.
 * @param {Verdict|null|undefined} verdict
 * @returns {(Node|string)[]}
 */
function differences(verdict) {
  const expected = (/** @type {string} */ text) => h('mark', { class: 'expected' }, text);
  const given = (/** @type {string} */ text) => h('mark', { class: 'given' }, text);
  switch (verdict?.kind) {
    case 'withheld':
      return verdict.withheld.flatMap((w, i) =>
        [...(i ? [h('br', {})] : []), given(json(w.call)), ` withheld: ${w.reason.replaceAll('_', ' ')}`]);
    case 'wrong_count':
      return [expected(`${verdict.expected} calls`), ' expected, ', given(`${verdict.given}`), ' given'];
    case 'wrong_tool':
      return [`call ${verdict.call + 1}: `, expected(verdict.expected), ' → ', given(verdict.given)];
    case 'wrong_arguments':
      return verdict.differences.flatMap((diff, i) => {
        const name = h('code', {}, diff.argument ?? 'arguments');
        const at = [...(i ? [h('br', {})] : []), `${diff.tool}: `, name];
        switch (diff.problem) {
          case 'missing': return [...at, ' missing, expected ', expected(json(diff.expected))];
          case 'extra': return [...at, ' extra: ', given(json(diff.given))];
          case 'wrong_value': return [...at, ' ', expected(json(diff.expected)), ' → ', given(json(diff.given))];
        }
        return at;
      });
    default:
      return [];
  }
}

/**
 * The held-out rows one model answered wrong, grouped by kind (in the charts' order and colours), the
 * expected and the given calls side by side with what differs.
 * @param {string} name @param {Answered[]} wrong @param {Map<AnswerKind, KindKey>} keys
 */
function wrongAnswers(name, wrong, keys) {
  const calls = (/** @type {unknown[]|null} */ value) => value ? json(value) : 'no call list that parses';
  /** @type {Map<string, Answered[]>} */
  const byKind = new Map();
  for (const row of wrong) {
    const kind = row.verdict?.kind ?? '';
    byKind.set(kind, [...(byKind.get(kind) ?? []), row]);
  }
  const order = [...keys.keys()];
  const kinds = [...byKind.keys()].sort((a, b) =>
    (order.indexOf(/** @type {AnswerKind} */ (a)) >>> 0) - (order.indexOf(/** @type {AnswerKind} */ (b)) >>> 0));
  return h('details', { class: 'wrong-answers' },
    h('summary', {}, `${name}: ${wrong.length} answered wrong`),
    ...kinds.map((kind) => {
      const rows = byKind.get(kind) ?? [];
      const key = keys.get(/** @type {AnswerKind} */ (kind));
      return h('section', { 'data-kind': kind },
        h('h4', {}, ...(key ? [h('span', { class: 'swatch', style: `background: ${key.color}` })] : []),
          `${key?.label ?? 'not told apart (scored before kinds were kept)'}: ${rows.length}`),
        h('table', { class: 'scores' },
          h('thead', {}, h('tr', {}, h('th', {}, 'Line'), h('th', {}, 'Query'), h('th', {}, 'Expected'),
            h('th', {}, 'Given'), h('th', {}, 'What differs'))),
          h('tbody', {}, ...rows.map((row) => h('tr', {},
            h('td', {}, String(row.line)),
            h('td', {}, row.query),
            h('td', {}, h('code', {}, calls(row.expected))),
            h('td', { title: row.text }, h('code', {}, calls(row.given))),
            h('td', { class: 'differs' }, ...differences(row.verdict)))))));
    }));
}

/**
 * How the scores were made, and what is missing from them.
 * @param {HistoryEntry} entry @param {number} examples
 */
function evaluationNote(entry, examples) {
  const cact = entry.cact;
  return `${examples} held-out example(s), answered by greedy decoding; a call counts when it equals the expected one exactly.` +
    (cact && !cact.rows ? ` The .cact was not scored${cact.scores_error ? `: ${cact.scores_error}` : ' (build it again to score it)'}.` : '') +
    (!cact ? ' Build the .cact (Export) to score it too.' : '');
}

/**
 * Prefills Try from the dataset's first sample (once: the user's own edits are kept).
 * @param {DatasetReport} report
 */
function prefillTry(report) {
  const sample = report.samples[0];
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

/** What a cut answer says about why it was cut. */
const CUT = {
  max_length: "The answer was cut: the prompt and answer filled the model's context (max_seq_len).",
  max_new_tokens: 'The answer was cut at the most new tokens a try may take.',
};

/** @param {'try-base' | 'try-tuned'} id the answer's box @param {TryAnswer|null} answer */
function renderAnswer(id, answer) {
  const body = /** @type {HTMLElement} */ ($(id).querySelector('.answer-body'));
  if (!answer) {
    body.replaceChildren('No tuned model yet: start a training or open one from History.');
    return;
  }
  const calls = answer.calls == null ? h('p', { class: 'verdict', 'data-ok': 'false' }, 'No parseable call')
    : h('pre', {}, answer.calls.length ? answer.calls.map((c) => JSON.stringify(c)).join('\n')
      : answer.withheld.length ? '(nothing acted on)' : '(no call)');
  // What the checks held back is not acted on: listed apart, each with why.
  const withheld = answer.withheld.length ? [h('div', { class: 'withheld' },
    h('p', { class: 'warning small' }, `Withheld (not acted on): ${answer.withheld.length}`),
    h('ul', { class: 'small' }, ...answer.withheld.map((w) => h('li', {}, h('code', {}, JSON.stringify(w.call)), ` — ${w.why}`))))] : [];
  body.className = 'answer-body';
  // The whole answer is open when no call could be read from it: that is what to look at.
  /** @type {Record<string, string>} */
  const open = answer.calls == null ? { open: '' } : {};
  const cut = answer.stop === 'max_length' || answer.stop === 'max_new_tokens' ? CUT[answer.stop] : null;
  body.replaceChildren(calls, ...withheld,
    h('p', { class: 'small confidence' }, `Confidence ${answer.confidence.toFixed(2)}`),
    h('details', open, h('summary', { class: 'small muted' }, 'Full answer'), h('pre', {}, answer.text)),
    ...(cut ? [h('p', { class: 'warning small' }, cut)] : []),
    h('div', { class: 'small muted' }, `${answer.tokens_per_s.toFixed(0)} tokens/s`));
}

async function askModels() {
  const entry = state.entry?.adapter ? state.entry : null;
  const question = { training_id: entry?.id ?? null, tools: $('try-tools').value, query: $('try-query').value };
  $('try-button').disabled = true;
  $('try-status').textContent = entry ? 'The base and the tuned model are answering…' : 'The base model is answering…';
  setMessage($('try-error'), null);
  try {
    const answers = await api.tryModel(question);
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

export function wireEvaluate() {
  $('try-button').addEventListener('click', askModels);
  $('threshold-range').addEventListener('input', () =>
    renderTradeoff(Number($('threshold-range').value)));
  $('threshold-range').addEventListener('change', pickThreshold);
  $('acceptance-button').addEventListener('click', runAcceptance);
  $('suite-choose').addEventListener('click', chooseSuite);
  api.onDragDrop(takeDroppedSuite)
    .catch((error) => setMessage($('acceptance-error'), `Drag and drop is unavailable: ${error}`));
  hear('shown', renderEvaluation);
  hear('rebuilt', renderEvaluation);
  hear('report', prefillTry);
  hear('suite', offerSuite);
}
