// @ts-check
// What the app's commands return and what their channels send, as the Rust side serializes it
// (src-tauri/src and the engine types it passes on). Types only: nothing here runs.

// ---------- hardware and settings ----------

/** @typedef {'cpu'|'cuda'|'metal'} Backend `needle_engine::backend::Backend` */

/**
 * The backend the engine picked and why (`needle_engine::backend::BackendInfo`).
 * @typedef {object} BackendInfo
 * @property {Backend} backend
 * @property {string} device Human-readable device name (GPU model, or CPU brand).
 * @property {number|null} memory_bytes
 * @property {number|null} memory_free_bytes
 * @property {Backend[]} compiled Backends this binary was built with.
 * @property {string} reason
 */

/**
 * What the app remembers between launches (`preferences::Preferences`).
 * @typedef {object} Preferences
 * @property {string|null} checkpoint
 * @property {string|null} tokenizer
 * @property {Generation} [generation] The published base model chosen by Download or Use; the app
 *   keeps it, so the window's own save leaves it out.
 * @property {string} device `auto`, or a backend forced by the user.
 * @property {string} preset
 */

/**
 * A training's hyper-parameters (`needle_engine::settings::TrainSettings`).
 * @typedef {object} TrainSettings
 * @property {number} epochs
 * @property {number} lr
 * @property {number} rank
 * @property {number} alpha
 * @property {number} batch_size
 * @property {number} max_len
 * @property {number} val_split
 * @property {number} seed
 */

/** @typedef {keyof TrainSettings} TrainField */

/**
 * One of the Train panel's fields as the app describes it (`needle_engine::settings::FormField`).
 * @typedef {object} FormField
 * @property {TrainField} name
 * @property {string} label
 * @property {boolean} whole Only whole, non-negative numbers.
 * @property {number|null} min null: unbounded.
 * @property {number|null} max null: unbounded.
 * @property {'1'|'any'} step
 * @property {number} default The reference's recipe.
 */

/**
 * A `.cact` width Build offers (`needle_engine::settings::BuildWidth`).
 * @typedef {object} BuildWidth
 * @property {number} bits
 * @property {string} label
 * @property {boolean} default The width chosen unless the user picks another.
 */

/**
 * @typedef {object} Preset `training_request::Preset`
 * @property {string} name
 * @property {string} label
 * @property {string} description
 * @property {TrainSettings} settings
 */

/**
 * Everything the window shows when it opens (`studio::Startup`).
 * @typedef {object} Startup
 * @property {BackendInfo} hardware
 * @property {string[]} devices The device selector's choices: `auto`, then the compiled backends.
 * @property {Preferences} preferences
 * @property {string|null} dataset The dataset given at launch.
 * @property {Preset[]} presets
 * @property {FormField[]} training_fields The Train panel's fields, in display order.
 * @property {BuildWidth[]} build_widths
 * @property {HistoryEntry[]} history
 */

// ---------- base model ----------

/**
 * @typedef {object} BaseModel `needle_engine::hub::BaseModel`
 * @property {string} checkpoint
 * @property {string} tokenizer
 */

/**
 * The download as the app last heard of it (`base_model::DownloadState`).
 * @typedef {{state: 'idle'}
 *   | {state: 'running', file: string, bytes: number, total: number}
 *   | {state: 'done'}
 *   | {state: 'failed', message: string}
 *   | {state: 'cancelled', message: string}} DownloadState
 */

/** @typedef {'Needle2'|'Needle3'} Generation `needle_engine::config::Generation` */

/**
 * One published base model as the Base model panel offers it (`base_model::BaseModelOffer`).
 * @typedef {object} BaseModelOffer
 * @property {Generation} generation
 * @property {string} label `Needle 3`.
 * @property {string} repo
 * @property {BaseModel|null} cached Its files, when both are in the cache.
 * @property {number|null} bytes Both files' size: on disk when cached, else as the hub announces
 *   them; null while downloading or when the hub cannot be asked (`note` says why).
 * @property {number} partial_bytes Bytes of a cut download already on disk.
 * @property {string|null} note Why the hub could not be asked.
 * @property {DownloadState} download
 */

/**
 * What the Base model panel shows (`base_model::BaseModelStatus`).
 * @typedef {object} BaseModelStatus
 * @property {Generation} chosen The generation last chosen by Download or Use.
 * @property {BaseModelOffer[]} models Newest first.
 */

/**
 * The hub's progress (`needle_engine::hub::HubEvent`).
 * @typedef {{event: 'cached', file: string, path: string, bytes: number}
 *   | {event: 'started', file: string, total: number, resumed_from: number}
 *   | {event: 'progress', file: string, bytes: number, total: number, bytes_per_s: number, eta_s: number}
 *   | {event: 'downloaded', file: string, path: string, bytes: number}
 *   | {event: 'uploading', file: string, total: number}
 *   | ({event: 'uploaded'} & Uploaded)
 *   | {event: 'failed', message: string}} HubEvent
 */

/**
 * A file committed to a repository on the hub (`needle_engine::hub::Uploaded`).
 * @typedef {object} Uploaded
 * @property {string} file `org/model/path`
 * @property {number} bytes
 * @property {string} url The repository's page.
 * @property {string|null} commit `null`: the repository already held these bytes there.
 */

/**
 * The download channel (`base_model::DownloadMessage`).
 * @typedef {({kind: 'progress'} & HubEvent)
 *   | {kind: 'finished', state: DownloadState, base: BaseModel|null}} DownloadMessage
 */

/** @typedef {'idle'|'stopping'} CancelDownload `base_model::CancelDownload` */

// ---------- dataset ----------

/**
 * One problem of a dataset (`needle_engine::dataset::Problem`).
 * @typedef {object} DatasetProblem
 * @property {number} line
 * @property {{kind: string}} issue
 * @property {boolean} skipped Whether the line is left out of training.
 * @property {string} message
 */

/**
 * @typedef {object} Sample `needle_engine::dataset::report::Sample`
 * @property {number} line
 * @property {string} prompt
 * @property {string} target
 * @property {number} tokens
 * @property {string} tools
 * @property {string} query
 */

/**
 * What `needle data --json` prints (`needle_engine::dataset::report::DatasetReport`).
 * @typedef {object} DatasetReport
 * @property {string} path
 * @property {number} usable_examples
 * @property {number} skipped_lines
 * @property {DatasetProblem[]} problems The first problems in line order.
 * @property {Record<string, number>} problem_counts Every problem, by kind.
 * @property {number} problems_total
 * @property {{min: number, median: number, max: number}} token_lengths
 * @property {{up_to: number, count: number}[]} histogram
 * @property {number} cap
 * @property {number} seq_len
 * @property {number} truncated
 * @property {Sample[]} samples
 * @property {Checkup} doctor
 */

/**
 * One kind of problem the doctor found (`needle_engine::dataset::Finding`).
 * @typedef {object} Finding
 * @property {string} kind
 * @property {'error'|'advice'} severity Errors are the rows `needle data --fix` leaves out.
 * @property {string|null} tool
 * @property {string|null} argument
 * @property {number} count Rows (for `few_examples`: calls of the tool).
 * @property {number[]} lines The rows' 1-based lines, the first hundred.
 * @property {string} message
 */

/**
 * The dataset doctor's report (`needle_engine::dataset::Checkup`).
 * @typedef {object} Checkup
 * @property {string} summary What to fix first, in one sentence.
 * @property {Finding[]} findings Errors first, then advice; the first fifty.
 * @property {number} unlisted_findings Findings past those listed.
 * @property {number} rows
 * @property {number} failing_rows
 * @property {number} rows_without_call
 * @property {number} no_call_share
 * @property {Record<string, number>} calls_per_tool The hundred most called tools.
 * @property {number} unlisted_tools Tools offered past those.
 */

// ---------- generate ----------

/** @typedef {'generate_key'|'hub_token'} SecretName Which secret (`api_key::SecretName`). */

/**
 * Where a secret (Generate's key, Publish's token) comes from (`api_key::KeySource`).
 * @typedef {{source: 'environment', variable: string}
 *   | {source: 'keychain'}
 *   | {source: 'session', note: string}
 *   | {source: 'none'}} KeySource
 */

/**
 * The generation as the app last heard of it (`generating::GenerationState`).
 * @typedef {{state: 'idle'}
 *   | {state: 'running', generated: number, wanted: number, failed_requests: number,
 *       rejected: Record<string, number>, stopping: boolean}
 *   | ({state: 'written'} & Written)
 *   | {state: 'failed', message: string}} GenerationState
 */

/**
 * The written file (`generating::Written`): the dataset's rows, then the new ones.
 * @typedef {object} Written
 * @property {string} path
 * @property {number} written Rows in the file.
 * @property {number} generated New rows, the last ones.
 * @property {number} wanted
 * @property {number} failed_requests
 * @property {Record<string, number>} rejected
 * @property {Record<string, number>} advice
 * @property {boolean} cancelled
 * @property {{query?: string, answers?: unknown}[]} rows The first new rows.
 */

/**
 * What the Generate form starts with (`generating::GenerateSetup`).
 * @typedef {object} GenerateSetup
 * @property {number} count
 * @property {string} model
 * @property {string} endpoint Used when the field is left empty.
 * @property {KeySource} key
 * @property {GenerationState} state
 */

/**
 * What Generate sends, as typed (`generating::GenerateRequest`).
 * @typedef {object} GenerateRequest
 * @property {string} dataset
 * @property {string} output Empty: beside the dataset, as `DATA.augmented.jsonl`.
 * @property {string} count
 * @property {string} model
 * @property {string} endpoint
 */

/**
 * The generation channel (`generating::GenerateMessage`).
 * @typedef {{kind: 'progress', state: GenerationState}
 *   | {kind: 'request_failed', message: string}
 *   | {kind: 'finished', state: GenerationState}} GenerateMessage
 */

// ---------- training ----------

/**
 * A training as the window sends it (`training_request::TrainingDraft`): each setting as typed, checked by the app.
 * @typedef {object} TrainingDraft
 * @property {string} dataset
 * @property {string} checkpoint
 * @property {string} tokenizer
 * @property {string} device
 * @property {Partial<Record<TrainField, string>>} settings
 */

/** @typedef {Record<string, string>} FieldErrors Field name → what is wrong and how to fix it. */

/**
 * What a training will do (`needle_engine::train::Plan`).
 * @typedef {object} Plan
 * @property {number} examples
 * @property {number} validation
 * @property {number} seq_len
 * @property {number} steps_per_epoch
 * @property {number} steps
 * @property {number} warmup
 * @property {number} adapted_weights
 * @property {number} trainable_parameters
 * @property {number} memory_estimate_bytes
 * @property {boolean} recompute
 * @property {number} micro_batch
 * @property {number} tokens_per_pass
 * @property {number|null} memory_available_bytes
 * @property {number|null} seconds_estimate
 */

/** @typedef {'running'|'finished'|'stopped'|'failed'|'interrupted'} TrainingStatus `train::record::TrainingStatus` */

/**
 * Exact-call accuracy over a set of examples (`needle_engine::calls::Accuracy`).
 * @typedef {object} Accuracy
 * @property {number} examples
 * @property {number} exact
 * @property {number} parsed
 * @property {number} exact_rate
 * @property {number} parse_rate
 * @property {Record<string, {right: number, total: number}>} per_tool
 * @property {number} tokens_per_s
 */

/**
 * One held-out example a model answered wrong (`needle_engine::calls::Answered`).
 * @typedef {object} Answered
 * @property {number} line the example's line in the dataset file
 * @property {string} query
 * @property {unknown[]|null} expected the expected calls; null when the file's answer is not a list
 * @property {unknown[]|null} given the calls made; null when the answer holds none that parse
 * @property {string} text the whole answer
 * @property {boolean} right
 */

/** @typedef {{loss: number, calls: Accuracy, wrong?: Answered[]}} ModelScore `needle_engine::calls::ModelScore` */

/** @typedef {{base: ModelScore, tuned: ModelScore}} CallScores `needle_engine::calls::CallScores` */

/**
 * A built `.cact`, as read back from the file (`history::CactInfo`).
 * @typedef {object} CactInfo
 * @property {string} path
 * @property {number} bytes
 * @property {number} tensors
 * @property {string} scheme
 * @property {ModelScore|null} [scores]
 * @property {string|null} [scores_error]
 * @property {Uploaded|null} [published] Where Publish put this file on the hub.
 */

/**
 * A checked training, as its history entry keeps it (`training_request::TrainingRequest`).
 * @typedef {object} TrainingRequest
 * @property {string} dataset
 * @property {string} checkpoint
 * @property {string} tokenizer
 * @property {string} device
 * @property {TrainSettings} settings
 */

/**
 * One training as the History panel lists it (`history::HistoryEntry`).
 * @typedef {object} HistoryEntry
 * @property {string} id
 * @property {number} started_at Unix seconds.
 * @property {TrainingRequest} request
 * @property {string|null} backend
 * @property {TrainingStatus} status
 * @property {number|null} seconds
 * @property {number} steps_done
 * @property {number} steps
 * @property {number|null} final_loss
 * @property {number|null} final_val
 * @property {string|null} adapter
 * @property {string|null} message
 * @property {CactInfo|null} cact
 * @property {CallScores|null} [scores]
 * @property {string} suggested_cact
 * @property {boolean} resumable
 */

/** @typedef {{entry: HistoryEntry, chart: string|null}} Opened `studio::Opened` */

/**
 * The training worker's events the app passes on (`needle_engine::train::Event`; `saved`,
 * `finished` and `failed` become the app's own messages).
 * @typedef {{event: 'started', backend: string, device: string, examples: number, validation: number,
 *     seq_len: number, steps: number, warmup: number, memory_estimate_bytes: number, first_step: number}
 *   | {event: 'step', step: number, total: number, loss: number, lr: number, tokens_per_s: number, eta_s: number}
 *   | {event: 'epoch', epoch: number, loss: number, val: number|null}
 *   | {event: 'scoring', examples: number}
 *   | {event: 'unscored', message: string}} TrainEvent
 */

/**
 * The training channel (`training::TrainingMessage`).
 * @typedef {({kind: 'progress'} & TrainEvent)
 *   | {kind: 'chart', svg: string}
 *   | {kind: 'log', line: string}
 *   | {kind: 'finished', entry: HistoryEntry}
 *   | {kind: 'failed', message: string, entry: HistoryEntry}} TrainingMessage
 */

/** @typedef {'stopping'|'killed'|'idle'} CancelAnswer The answer to Cancel (`training_slot::CancelAnswer`). */

// ---------- build ----------

/**
 * The export's progress the app passes on (`needle_engine::cact::ExportEvent`; `built` and
 * `failed` become the app's own messages).
 * @typedef {{event: 'stage', label: string, index: number, of: number}
 *   | {event: 'merged', adapter: string, groups: number}} ExportEvent
 */

/**
 * The build channel (`building::BuildMessage`).
 * @typedef {({kind: 'progress'} & ExportEvent)
 *   | {kind: 'scoring'}
 *   | {kind: 'built', cact: CactInfo, entry: HistoryEntry}
 *   | {kind: 'failed', message: string}} BuildMessage
 */

// ---------- publish ----------

/**
 * The upload as the app last heard of it (`publishing::PublishState`).
 * @typedef {{state: 'idle'}
 *   | {state: 'running', file: string, bytes: number, total: number}
 *   | ({state: 'published'} & Uploaded)
 *   | {state: 'failed', message: string}} PublishState
 */

/**
 * What the Publish form starts with (`publishing::PublishSetup`).
 * @typedef {object} PublishSetup
 * @property {string|null} repo `NEEDLE_HF_REPO`, when set.
 * @property {KeySource} token
 * @property {PublishState} state
 */

/**
 * The publish channel (`publishing::PublishMessage`).
 * @typedef {({kind: 'progress'} & HubEvent)
 *   | {kind: 'finished', state: PublishState}} PublishMessage
 */

// ---------- try ----------

/**
 * @typedef {object} Question `tryout::Question`
 * @property {string|null} training_id The training whose adapter answers beside the base.
 * @property {string} tools The tool schemas, as JSON text.
 * @property {string} query
 */

/**
 * One model's answer (`tryout::TryAnswer`).
 * @typedef {object} TryAnswer
 * @property {string} text
 * @property {unknown[]|null} calls The parsed calls; null when none could be read.
 * @property {number} tokens_per_s
 * @property {'end_of_turn'|'eos'|'max_new_tokens'|'max_length'} stop
 */

/** @typedef {{base: TryAnswer, tuned: TryAnswer|null}} Answers `tryout::Answers` */

export {};
