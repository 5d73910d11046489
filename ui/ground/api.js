// @ts-check
// The app's commands, channels and window services (dialogs, drag and drop): the one module that
// knows their names. One function per command (each step's commands.rs in src-tauri/src), each calling
// it through `invoke`, which is typed with types.d.ts's `Commands` (generated from the Rust commands):
// a wrong command name, argument key or argument type, or an answer read as another type, fails tsc.

/** @typedef {import('./types.js').Answers} Answers */
/** @typedef {import('./types.js').BaseModel} BaseModel */
/** @typedef {import('./types.js').BaseModelStatus} BaseModelStatus */
/** @typedef {import('./types.js').BuildMessage} BuildMessage */
/** @typedef {import('./types.js').BuildRequest} BuildRequest */
/** @typedef {import('./types.js').CancelDownload} CancelDownload */
/** @typedef {import('./types.js').CancelAnswer} CancelAnswer */
/**
 * @template T
 * @typedef {import('./types.js').Channel<T>} Channel
 */
/** @typedef {import('./types.js').Commands} Commands */
/** @typedef {import('./types.js').DatasetReport} DatasetReport */
/** @typedef {import('./types.js').DownloadMessage} DownloadMessage */
/** @typedef {import('./types.js').Evaluation} Evaluation */
/** @typedef {import('./types.js').FieldErrors} FieldErrors */
/** @typedef {import('./types.js').GenerateMessage} GenerateMessage */
/** @typedef {import('./types.js').GenerateRequest} GenerateRequest */
/** @typedef {import('./types.js').GenerateSetup} GenerateSetup */
/** @typedef {import('./types.js').Generation} Generation */
/** @typedef {import('./types.js').HistoryEntry} HistoryEntry */
/** @typedef {import('./types.js').KeySource} KeySource */
/** @typedef {import('./types.js').LadderMessage} LadderMessage */
/** @typedef {import('./types.js').Opened} Opened */
/** @typedef {import('./types.js').Plan} Plan */
/** @typedef {import('./types.js').Preferences} Preferences */
/** @typedef {import('./types.js').PublishMessage} PublishMessage */
/** @typedef {import('./types.js').PublishSetup} PublishSetup */
/** @typedef {import('./types.js').PublishState} PublishState */
/** @typedef {import('./types.js').Question} Question */
/** @typedef {import('./types.js').TrainingDraft} TrainingDraft */
/** @typedef {import('./types.js').TrainingMessage} TrainingMessage */
/** @typedef {import('./types.js').SecretName} SecretName */
/** @typedef {import('./types.js').Startup} Startup */

/**
 * What a file dropped on (or dragged over) the window says.
 * @typedef {{type: 'enter'|'over'|'drop'|'leave', paths?: string[]}} DragDrop
 */

/**
 * The part of Tauri's global API (`withGlobalTauri`) the window uses.
 * @typedef {object} TauriGlobal
 * @property {{invoke: (command: string, args: object) => Promise<unknown>,
 *   Channel: new () => Channel<any>}} core
 * @property {{open: (options: object) => Promise<string|string[]|null>,
 *   save: (options: object) => Promise<string|null>}} dialog
 * @property {{getCurrentWebview: () => {
 *   onDragDropEvent: (handler: (event: {payload: DragDrop}) => void) => Promise<() => void>}}} webview
 */

const tauri = /** @type {{__TAURI__?: TauriGlobal}} */ (/** @type {unknown} */ (window)).__TAURI__;

/** Whether the page runs inside the desktop app (every other function needs it). */
export const hasRuntime = () => tauri != null;

/**
 * Calls `command` with `args`, its answer typed as the Rust command returns it.
 * @template {keyof Commands & string} C
 * @param {C} command
 * @param {Commands[C]['args']} args
 * @returns {Promise<Commands[C]['answer']>}
 */
const invoke = (command, args) =>
  /** @type {Promise<Commands[C]['answer']>} */ (/** @type {TauriGlobal} */ (tauri).core.invoke(command, args));

/**
 * A channel that hands each message to `onMessage`.
 * @template T
 * @param {(message: T) => void} onMessage
 * @returns {Channel<T>}
 */
function channel(onMessage) {
  /** @type {Channel<T>} */
  const created = new (/** @type {TauriGlobal} */ (tauri).core.Channel)();
  created.onmessage = onMessage;
  return created;
}

/** @returns {Promise<Startup>} */
export const startup = () => invoke('startup', {});

/** @param {Preferences} preferences @returns {Promise<null>} */
export const savePreferences = (preferences) => invoke('save_preferences', { preferences });

/** @returns {Promise<BaseModelStatus>} */
export const baseModel = () => invoke('base_model', {});

/**
 * @param {Generation} generation @param {(message: DownloadMessage) => void} onEvent
 * @returns {Promise<null>}
 */
export const downloadBaseModel = (generation, onEvent) =>
  invoke('download_base_model', { generation, onEvent: channel(onEvent) });

/** @param {Generation} generation @returns {Promise<BaseModel>} */
export const useBaseModel = (generation) => invoke('use_base_model', { generation });

/** @returns {Promise<CancelDownload>} */
export const cancelDownload = () => invoke('cancel_download', {});

/**
 * The report `needle data --json` prints for `path`, its token lengths counted with `tokenizer`, its
 * lines read and rendered as the generation of `checkpoint` reads them.
 * @param {string} path @param {string|null} tokenizer @param {string|null} checkpoint
 * @param {string} maxLen as typed
 * @returns {Promise<DatasetReport>}
 */
export const loadDataset = (path, tokenizer, checkpoint, maxLen) =>
  invoke('load_dataset', { path, tokenizer, checkpoint, maxLen });

/**
 * Line `line` of the dataset at `path` as written (a doctor's finding, clicked).
 * @param {string} path @param {number} line @returns {Promise<string>}
 */
export const datasetLine = (path, line) => invoke('dataset_line', { path, line });

/** @returns {Promise<GenerateSetup>} */
export const generateSetup = () => invoke('generate_setup', {});

/** @param {SecretName} name @param {string} key @returns {Promise<KeySource>} where it is kept */
export const rememberKey = (name, key) => invoke('remember_key', { name, key });

/** @param {SecretName} name @returns {Promise<KeySource>} */
export const forgetKey = (name) => invoke('forget_key', { name });

/**
 * @param {GenerateRequest} request @param {(message: GenerateMessage) => void} onEvent
 * @returns {Promise<null>}
 */
export const generateExamples = (request, onEvent) =>
  invoke('generate_examples', { request, onEvent: channel(onEvent) });

/** @returns {Promise<CancelAnswer>} */
export const cancelGeneration = () => invoke('cancel_generation', {});

/** @param {TrainingDraft} draft @returns {Promise<FieldErrors>} empty when the training can start */
export const validateTraining = (draft) => invoke('validate_training', { draft });

/** @param {TrainingDraft} draft @returns {Promise<Plan>} */
export const planTraining = (draft) => invoke('plan_training', { draft });

/**
 * @param {TrainingDraft} draft @param {(message: TrainingMessage) => void} onEvent
 * @returns {Promise<HistoryEntry>} the training's record as it starts
 */
export const startTraining = (draft, onEvent) => invoke('start_training', { draft, onEvent: channel(onEvent) });

/**
 * @param {string} id @param {(message: TrainingMessage) => void} onEvent
 * @returns {Promise<HistoryEntry>}
 */
export const resumeTraining = (id, onEvent) => invoke('resume_training', { id, onEvent: channel(onEvent) });

/** @returns {Promise<CancelAnswer>} */
export const cancelTraining = () => invoke('cancel_training', {});

/**
 * @param {string} trainingId @param {BuildRequest} request @param {(message: BuildMessage) => void} onEvent
 * @returns {Promise<null>}
 */
export const buildCact = (trainingId, request, onEvent) =>
  invoke('build_cact', { trainingId, request, onEvent: channel(onEvent) });

/** Why the training's model has no depth ladder, or null. @param {string} trainingId @returns {Promise<string|null>} */
export const ladderRefusal = (trainingId) => invoke('ladder_refusal', { trainingId });

/**
 * @param {string} trainingId @param {(message: LadderMessage) => void} onEvent
 * @returns {Promise<null>}
 */
export const scoreLadder = (trainingId, onEvent) => invoke('score_ladder', { trainingId, onEvent: channel(onEvent) });

/** Asks the sweep to stop (again: ends it now); its outcome follows on its channel. @returns {Promise<CancelAnswer>} */
export const cancelLadder = () => invoke('cancel_ladder', {});

/** @returns {Promise<PublishSetup>} */
export const publishSetup = () => invoke('publish_setup', {});

/**
 * @param {string} trainingId @param {string} repo @param {(message: PublishMessage) => void} onEvent
 * @returns {Promise<null>}
 */
export const publishCact = (trainingId, repo, onEvent) => invoke('publish_cact', { trainingId, repo, onEvent: channel(onEvent) });

/** Stops the upload going before its commit; its outcome follows on its channel. @returns {Promise<PublishState>} */
export const cancelPublish = () => invoke('cancel_publish', {});

/** @param {string} trainingId @returns {Promise<Evaluation>} */
export const evaluation = (trainingId) => invoke('evaluation', { trainingId });

/** @param {Question} question @returns {Promise<Answers>} */
export const tryModel = (question) => invoke('try_model', { question });

/**
 * Keeps `threshold` as the confidence training `trainingId`'s model ships with.
 * @param {string} trainingId @param {number} threshold @returns {Promise<HistoryEntry>}
 */
export const pickThreshold = (trainingId, threshold) => invoke('pick_threshold', { trainingId, threshold });

/**
 * Runs the acceptance suite at `suite` on training `trainingId`'s models.
 * @param {string} trainingId @param {string} suite @returns {Promise<HistoryEntry>}
 */
export const runAcceptance = (trainingId, suite) => invoke('run_acceptance', { trainingId, suite });

/** @returns {Promise<HistoryEntry[]>} */
export const history = () => invoke('history', {});

/** @param {string} id @returns {Promise<Opened>} */
export const openTraining = (id) => invoke('open_training', { id });

/** @param {string} path @returns {Promise<null>} */
export const reveal = (path) => invoke('reveal', { path });

/**
 * The file dialog (or the save dialog) for one extension (or a few); the chosen path or null.
 * @param {{name: string, ext: string|string[], current?: string|null, save?: boolean}} options
 * @returns {Promise<string|null>}
 */
export async function choosePath({ name, ext, current, save = false }) {
  const { dialog } = /** @type {TauriGlobal} */ (tauri);
  const options = { filters: [{ name, extensions: [ext].flat() }], ...(current ? { defaultPath: current } : {}) };
  const path = save ? await dialog.save(options) : await dialog.open({ ...options, multiple: false });
  return typeof path === 'string' ? path : null;
}

/**
 * Calls `handler` for each file dragged over or dropped on the window.
 * @param {(event: DragDrop) => void} handler
 * @returns {Promise<unknown>}
 */
export const onDragDrop = (handler) =>
  /** @type {TauriGlobal} */ (tauri).webview.getCurrentWebview().onDragDropEvent(({ payload }) => handler(payload));
