// @ts-check
// The Evaluate step: the held-out scores of the training shown, and Try (one question to the base and
// the tuned model, side by side).

import * as api from '../ground/api.js';
import { $, formatLoss, h, percent, setMessage } from '../ground/dom.js';
import { hear, state } from '../ground/state.js';

/** @typedef {import('../ground/types.js').Answered} Answered */
/** @typedef {import('../ground/types.js').DatasetReport} DatasetReport */
/** @typedef {import('../ground/types.js').HistoryEntry} HistoryEntry */
/** @typedef {import('../ground/types.js').ModelScore} ModelScore */
/** @typedef {import('../ground/types.js').TryAnswer} TryAnswer */

/**
 * The held-out scores of a training: base, tuned and (once built) the .cact, with a warning when the
 * file answers markedly worse than the tuned model it was built from.
 * @param {HistoryEntry|null} entry
 */
function renderEvaluation(entry) {
  const scores = entry?.scores;
  const cact = entry?.cact?.scores;
  $('evaluation-table').hidden = !scores;
  $('evaluation-empty').hidden = Boolean(scores);
  /** @type {[string, ModelScore][]} */
  const rows = scores ? [['Base', scores.base], ['Tuned', scores.tuned]] : [];
  if (scores && cact) rows.push([`.cact (${entry?.cact?.scheme})`, cact]);
  $('evaluation-rows').replaceChildren(...rows.map(([name, score]) => h('tr', {},
    h('th', { scope: 'row' }, name),
    h('td', {}, formatLoss(score.loss)),
    h('td', {}, `${score.calls.exact} / ${score.calls.examples} (${percent(score.calls.exact_rate)})`),
    h('td', {}, percent(score.calls.parse_rate)))));
  const worse = scores && cact &&
    (cact.calls.exact_rate < scores.tuned.calls.exact_rate - 0.1 || cact.loss > scores.tuned.loss * 1.1);
  setMessage($('evaluation-warning'), worse &&
    `The .cact answers markedly worse than the tuned model (${percent(cact.calls.exact_rate)} exact calls against ` +
    `${percent(scores.tuned.calls.exact_rate)}, loss ${formatLoss(cact.loss)} against ${formatLoss(scores.tuned.loss)}): ` +
    'quantization costs this model accuracy. ' +
    (/^W2/.test(entry?.cact?.scheme ?? '') ? 'Build it at 4 bits rather than 2, or check' : 'Check') +
    ' it with Try before shipping.');
  $('evaluation-note').textContent = scores && entry ? evaluationNote(entry, scores.base.calls.examples) : '';
  setMessage($('evaluation-advice'), scores && entry && parseAdvice(entry, scores.base, scores.tuned));
  $('evaluation-wrong').replaceChildren(...rows
    .filter(([, score]) => score.wrong?.length)
    .map(([name, score]) => wrongAnswers(name, score.wrong ?? [])));
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

/**
 * The held-out rows one model answered wrong, the expected and the given calls side by side.
 * @param {string} name @param {Answered[]} wrong
 */
function wrongAnswers(name, wrong) {
  const calls = (/** @type {unknown[]|null} */ value) => value ? JSON.stringify(value) : 'no call list that parses';
  return h('details', { class: 'wrong-answers' },
    h('summary', {}, `${name}: ${wrong.length} answered wrong`),
    h('table', { class: 'scores' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Line'), h('th', {}, 'Query'), h('th', {}, 'Expected'), h('th', {}, 'Given'))),
      h('tbody', {}, ...wrong.map((row) => h('tr', {},
        h('td', {}, String(row.line)),
        h('td', {}, row.query),
        h('td', {}, h('code', {}, calls(row.expected))),
        h('td', { title: row.text }, h('code', {}, calls(row.given))))))));
}

/**
 * How the scores were made, and what is missing from them.
 * @param {HistoryEntry} entry @param {number} examples
 */
function evaluationNote(entry, examples) {
  const cact = entry.cact;
  return `${examples} held-out example(s), answered by greedy decoding; a call counts when it equals the expected one exactly.` +
    (cact && !cact.scores ? ` The .cact was not scored${cact.scores_error ? `: ${cact.scores_error}` : ''}.` : '') +
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

/** @param {string} id the answer's box @param {TryAnswer|null} answer */
function renderAnswer(id, answer) {
  const body = $(id).querySelector('.answer-body');
  if (!answer) {
    body.replaceChildren('No tuned model yet: start a training or open one from History.');
    return;
  }
  const calls = answer.calls == null ? h('p', { class: 'verdict', 'data-ok': 'false' }, 'No parseable call')
    : h('pre', {}, answer.calls.length ? answer.calls.map((c) => JSON.stringify(c)).join('\n') : '(no call)');
  body.className = 'answer-body';
  // The whole answer is open when no call could be read from it: that is what to look at.
  /** @type {Record<string, string>} */
  const open = answer.calls == null ? { open: '' } : {};
  const cut = answer.stop === 'max_length' || answer.stop === 'max_new_tokens' ? CUT[answer.stop] : null;
  body.replaceChildren(calls, h('details', open, h('summary', { class: 'small muted' }, 'Full answer'), h('pre', {}, answer.text)),
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
  hear('shown', renderEvaluation);
  hear('rebuilt', renderEvaluation);
  hear('report', prefillTry);
}
