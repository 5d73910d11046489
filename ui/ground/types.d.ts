// The types the window's commands and channels carry, generated from the Rust types by
// src-tauri/tests/ui_types.rs; do not edit (NEEDLE_UI_TYPES=write cargo test -p needle-studio
// --test ui_types writes it again).

/** A channel a command sends its messages on (Tauri's `Channel`). */
export type Channel<T> = { onmessage: (message: T) => void };

/** Every command the window may call: the arguments it sends (as Tauri names them) and the answer. */
export type Commands = {
  base_model: { args: Record<string, never>; answer: BaseModelStatus };
  build_cact: { args: { trainingId: string; request: BuildRequest; onEvent: Channel<BuildMessage> }; answer: null };
  cancel_download: { args: Record<string, never>; answer: CancelDownload };
  cancel_generation: { args: Record<string, never>; answer: CancelAnswer };
  /** Asks the ladder sweep going to stop (a second time: ends it now); its outcome follows on its channel. */
  cancel_ladder: { args: Record<string, never>; answer: CancelAnswer };
  /** Stops the upload going before its commit; the outcome follows on its channel. */
  cancel_publish: { args: Record<string, never>; answer: PublishState };
  cancel_training: { args: Record<string, never>; answer: CancelAnswer };
  /** Line `line` of the dataset at `path`, as written (a doctor's finding, clicked). */
  dataset_line: { args: { path: string; line: number }; answer: string };
  download_base_model: { args: { generation: Generation; onEvent: Channel<DownloadMessage> }; answer: null };
  evaluation: { args: { trainingId: string }; answer: Evaluation };
  forget_key: { args: { name: SecretName }; answer: KeySource };
  generate_examples: { args: { request: GenerateRequest; onEvent: Channel<GenerateMessage> }; answer: null };
  generate_setup: { args: Record<string, never>; answer: GenerateSetup };
  history: { args: Record<string, never>; answer: HistoryEntry[] };
  /**
   * Why training `training_id`'s model has no depth ladder to score (a Needle 2 model), or nothing when
   * it has one.
   */
  ladder_refusal: { args: { trainingId: string }; answer: string | null };
  /** The report `needle data --json` prints, as it printed it; `max_len` as typed in the Train panel. */
  load_dataset: { args: { path: string; tokenizer: string | null; checkpoint: string | null; maxLen: unknown }; answer: DatasetReport };
  open_training: { args: { id: string }; answer: Opened };
  /** Keeps `threshold` as the confidence training `training_id`'s model ships with, and writes it beside its `.cact`. */
  pick_threshold: { args: { trainingId: string; threshold: number }; answer: HistoryEntry };
  plan_training: { args: { draft: TrainingDraft }; answer: Plan };
  publish_cact: { args: { trainingId: string; repo: string; onEvent: Channel<PublishMessage> }; answer: null };
  publish_setup: { args: Record<string, never>; answer: PublishSetup };
  /** Keeps a typed key or token in the keychain (or, without one, in memory until the app closes). */
  remember_key: { args: { name: SecretName; key: string }; answer: KeySource };
  resume_training: { args: { id: string; onEvent: Channel<TrainingMessage> }; answer: HistoryEntry };
  /** "Show in folder" for the adapter and the built file. */
  reveal: { args: { path: string }; answer: null };
  /** Runs the acceptance suite at `suite` on training `training_id`'s base, tuned model and `.cact`, at its threshold. */
  run_acceptance: { args: { trainingId: string; suite: string }; answer: HistoryEntry };
  save_preferences: { args: { preferences: Preferences }; answer: null };
  /** Scores every rung of training `training_id`'s depth ladder; progress and the table follow on `on_event`. */
  score_ladder: { args: { trainingId: string; onEvent: Channel<LadderMessage> }; answer: null };
  start_training: { args: { draft: TrainingDraft; onEvent: Channel<TrainingMessage> }; answer: HistoryEntry };
  /** Everything the window shows when it opens, once the rooms are open. */
  startup: { args: Record<string, never>; answer: Startup };
  try_model: { args: { question: Question }; answer: Answers };
  use_base_model: { args: { generation: Generation }; answer: BaseModel };
  validate_training: { args: { draft: TrainingDraft }; answer: FieldErrors };
};

export type Acceptance = {
  suite: string;
  /** The suite's own name. */
  name: string;
  /** The gate: a turn below this confidence is no call. */
  min_confidence: number;
  /** In the order scored: base, tuned, then the `.cact` when one is built. */
  models: SuiteScore[];
};

/**
 * Exact-call accuracy over a set of examples: the calls acted on (those that pass the schema and
 * grounding checks, [`CheckedAnswer`]) against the expected ones.
 */
export type Accuracy = {
  examples: number;
  /** Answers whose calls equal the expected ones, as JSON values in the order written. */
  exact: number;
  /** Answers with a parseable `<tool_call>` list. */
  parsed: number;
  exact_rate: number;
  parse_rate: number;
  /** Per expected tool name (`(no call)` for examples whose answer is no call): right / total. */
  per_tool: Record<string, ToolScore>;
  /** New tokens per second over all the answers. */
  tokens_per_s: number;
  /**
   * New tokens per second of decoding alone, each prompt's forward pass left out: the speed
   * an answer streams at (scores recorded before it was kept have 0).
   */
  decode_tokens_per_s?: number;
  /** Why the answers are wrong (scores recorded before it was kept have an empty one). */
  breakdown?: Breakdown;
  /**
   * How far the answers' confidence tells right from wrong; `None` for no answers (and in
   * scores recorded before it was kept).
   */
  confidence?: Reliability | null;
};

/**
 * What an answer is. A wrong one is the first of these that applies, in this order (after
 * [`AnswerKind::Exact`], which is listed first so that tallies read from right to wrong).
 */
export type AnswerKind =
  /** The calls expected, in the order expected. */
  | "exact"
  /**
   * The example's own answer is not a JSON list, so no answer matches it (the dataset doctor
   * names such rows).
   */
  | "unreadable_expected"
  /** The answer holds no `<tool_call>` block with a JSON list. */
  | "unparseable"
  /**
   * The calls acted on are not the expected ones because the checks held back a call the
   * model wrote (unknown tool, an argument against its schema, an ungrounded year).
   */
  | "withheld"
  /** Calls where none was expected. */
  | "false_fire"
  /** No call where one was expected. */
  | "false_refusal"
  /** Another number of calls than expected. */
  | "wrong_count"
  /** As many calls, but one names another tool. */
  | "wrong_tool"
  /** The right tools, but an argument is missing, extra or has another value. */
  | "wrong_arguments";

/** One example as the model answered it, beside what was expected (`needle eval --answers`). */
export type Answered = {
  /** The example's line in its file. */
  line: number;
  query: string;
  /** The expected calls; `None` when the file's answer is not a JSON list. */
  expected: unknown[] | null;
  /**
   * The calls the model wrote, withheld ones too; `None` when its answer holds no call list
   * that parses.
   */
  given: unknown[] | null;
  /** The model's whole answer, reasoning included. */
  text: string;
  /**
   * Whether the verdict is [`Verdict::Exact`] (what answers recorded before verdicts say;
   * `right` in those recorded before it was named so).
   */
  exact: boolean;
  /** What kind of answer it is, and what differs; `None` in answers recorded before it was kept. */
  verdict?: Verdict | null;
  /** The turn's confidence ([`Answer::confidence`]); `None` in answers recorded before it was kept. */
  confidence?: number | null;
  /** Its decode probability; `None` in answers recorded before it was kept. */
  decode?: number | null;
  /** What the model's confidence head said; `None` for a model without a trained one. */
  head?: number | null;
};

export type Answers = {
  base: TryAnswer;
  tuned: TryAnswer | null;
};

/** One way a call's arguments differ from the expected ones. */
export type ArgumentDiff = {
  /** The call's place in the answer, from 0. */
  call: number;
  tool: string;
  /**
   * The argument's name; `None` when the arguments differ as a whole: one side's are not a
   * JSON object, or the calls differ outside their arguments (both values are then the calls).
   */
  argument: string | null;
} & ArgumentProblem;

/** Missing, extra or another value, with the values there are. */
export type ArgumentProblem =
  | {
    problem: "missing";
    expected: unknown;
  }
  | {
    problem: "extra";
    given: unknown;
  }
  | {
    problem: "wrong_value";
    expected: unknown;
    given: unknown;
  };

/** A compute backend candle can run on. */
export type Backend =
  | "cpu"
  | "cuda"
  | "metal";

/**
 * The facts shown to the user about the chosen backend (`needle backend --json`, the app's badge,
 * training's `started` event).
 */
export type BackendInfo = {
  backend: Backend;
  /** Human-readable device name (GPU model, or CPU brand). */
  device: string;
  /** Memory the device can use: GPU memory, or system RAM for the CPU. `None` where it cannot tell. */
  memory_bytes: number | null;
  /** Free memory where the backend reports it. */
  memory_free_bytes: number | null;
  /** Backends this binary was built with. */
  compiled: Backend[];
  /** Why this backend, and why no faster one. */
  reason: string;
};

/** Paths to a base checkpoint and its tokenizer, wherever they came from. */
export type BaseModel = {
  checkpoint: string;
  tokenizer: string;
};

/** One published base model as the panel offers it. */
export type BaseModelOffer = {
  generation: Generation;
  /** "Needle 3", as the generation is displayed. */
  label: string;
  repo: string;
  /** Its checkpoint and tokenizer, when both are in the cache. */
  cached: BaseModel | null;
  /**
   * Bytes of both files: on disk when cached, else as the hub announces them; `None` while it
   * downloads, or when the hub cannot be asked (then `trouble` says why).
   */
  bytes: number | null;
  /** Bytes already on disk from a cancelled or cut download, which the next one resumes from. */
  partial_bytes: number;
  trouble: HubTrouble | null;
  /** Its download as the window last heard of it (idle while another generation downloads). */
  download: DownloadState;
};

/** What the Model step shows of the base models: every published one, newest first. */
export type BaseModelStatus = {
  /** The generation last chosen by Download or Use (Needle 3 until then). */
  chosen: Generation;
  models: BaseModelOffer[];
};

/** One bin of the reliability table: confidences in `[from, to)` (the last bin closed). */
export type Bin = {
  from: number;
  to: number;
  answers: number;
  right: number;
  /** The bin's mean confidence; `None` for an empty bin. */
  confidence: number | null;
};

/** Which JSON Schema bound a number breaks. */
export type Bound =
  | "minimum"
  | "maximum"
  | "exclusiveMinimum"
  | "exclusiveMaximum";

/** Answers by kind, per expected tool, and which tool was called where another was expected. */
export type Breakdown = {
  /**
   * How many answers are of each kind (kinds no answer has are left out); they add up to the
   * examples.
   */
  kinds: Record<string, number>;
  /**
   * Per expected tool, as the per-tool accuracy names them (an example counts under each tool
   * it expects): its answers by kind.
   */
  per_tool: Record<string, Record<string, number>>;
  /**
   * Expected tool → called tool → how many calls, the calls as the model wrote them (withheld
   * ones too: what it meant to call). Calls pair in the order written; one with
   * no partner (a false fire or refusal, more or fewer calls) pairs with `(no call)`, and an
   * unparseable answer's expected calls with `(unparseable)`. An answer of no calls expected
   * and none given counts once as `(no call)` → `(no call)`.
   */
  confusion: Record<string, Record<string, number>>;
};

/** What the window hears about a build. */
export type BuildMessage =
  /** The worker's `stage` and `merged` events, as they are. */
  | ({ kind: "progress" } & ExportEvent)
  /** The file is written; its weights are answering the held-out examples. */
  | { kind: "scoring" }
  /** Boxed: the file's record and the entry dwarf the other messages. */
  | {
    kind: "built";
    cact: CactInfo;
    entry: HistoryEntry;
  }
  | {
    kind: "failed";
    message: string;
  };

/**
 * What to build: a `bits`-bit `.cact` at `out`, of the whole model or (`layers`) one rung of its depth
 * ladder.
 */
export type BuildRequest = {
  bits: number;
  layers?: number | null;
  out: string;
};

/** A `.cact` width a build offers. */
export type BuildWidth = {
  bits: number;
  label: string;
  /** The width chosen unless the user picks another. */
  default: boolean;
};

/** A built `.cact`, as read back from the file. */
export type CactInfo = {
  path: string;
  bytes: number;
  tensors: number;
  scheme: string;
  /**
   * The tuned model three ways on the examples the training's scores used: float, its
   * quantization simulated, and this file read back; `None` without a validation split. (Files
   * scored before the three rows were kept have none: build again to score them.)
   */
  rows?: QuantRows | null;
  /** Why the file could not be scored, when it could not. */
  scores_error?: string | null;
  /** Where Publish put this file on the hub; a file built again is unpublished until published. */
  published?: Uploaded | null;
  /** The rung's depth when this file is one rung of the model's depth ladder, not the whole model. */
  layers?: number | null;
};

/** A call that can be acted on: a tool the turn offers, with arguments its schema accepts. */
export type Call = {
  name: string;
  arguments: Record<string, unknown>;
};

/** The base and the tuned model on the same held-out examples. */
export type CallScores = {
  base: ModelScore;
  tuned: ModelScore;
};

/**
 * The answer to Cancel, for a worker that stops at its next step when asked (a training, a
 * generation).
 */
export type CancelAnswer =
  /** Nothing was running any more. */
  | "idle"
  /** The worker stops after its current step and keeps what it has. */
  | "stopping"
  /** A second Cancel: the worker was ended at once. */
  | "killed";

/** The answer to Cancel. */
export type CancelDownload =
  /** Nothing was downloading. */
  | "idle"
  /** The transfer stops at its next chunk; what arrived is kept for next time. */
  | "stopping";

/** What a case tests. */
export type Category =
  /** A request a tool fits, with every value said: the calls. */
  | "positive"
  /** A required value not said: no call. */
  | "missing"
  /** No tool fits: no call. */
  | "irrelevant"
  /** A request the user says not to do: no call. */
  | "negation"
  /** A value outside the tool's bounds or set: no call. */
  | "invalid"
  /** Two requests at once: both calls. */
  | "parallel";

export type CategoryScore = {
  category: Category;
  passed: number;
  total: number;
};

/**
 * How many rows of a file are of one category, and their share of all its rows (rows whose
 * answers do not read are of none).
 */
export type CategoryShare = {
  category: RowCategory;
  rows: number;
  share: number;
};

/** The doctor's report on a file. */
export type Checkup = {
  /** One sentence: what to fix first. */
  summary: string;
  /** Errors first, then advice; within each, in the order of [`Kind`]; the first [`KEPT_FINDINGS`]. */
  findings: Finding[];
  /** Findings past the first [`KEPT_FINDINGS`], not listed. */
  unlisted_findings: number;
  rows: number;
  /** Rows with at least one error: what `--fix` leaves out. */
  failing_rows: number;
  /** The rows of each category a row shows by itself, in [`RowCategory`]'s order, every category listed. */
  categories: CategoryShare[];
  /**
   * The tools rows offer, with the number of calls of each in all the answers: the
   * [`KEPT_TOOLS`] most called (of equals, the first by name).
   */
  calls_per_tool: Record<string, number>;
  /** Tools offered past those [`Checkup::calls_per_tool`] keeps. */
  unlisted_tools: number;
};

/** The reliability of the models' confidence, and the gate the model ships with. */
export type ConfidenceView = {
  /** The reliability chart (SVG markup): each model's share right against its confidence. */
  chart: string;
  /** Base, tuned and `.cact` (when scored), in the chart's order. */
  models: ModelConfidence[];
  /** The threshold the model ships with: the one picked, else the one its figures propose. */
  threshold: number;
  /** Whether the user picked it. */
  picked: boolean;
  /** Where it is written beside the built `.cact`, once one is built. */
  file: string | null;
};

export type DatasetReport = {
  path: string;
  usable_examples: number;
  /** Lines left out of training (each has a problem saying why). */
  skipped_lines: number;
  /** Row lengths (BOS + prompt + target + EOS) before truncation. */
  token_lengths: LengthStats;
  histogram: HistogramBin[];
  /** The `--max-len` the sequence length was fitted under. */
  cap: number;
  seq_len: number;
  truncated: number;
  /** The first few examples as the model will see them. */
  samples: Sample[];
  /** The dataset doctor's findings: answers against their schemas, grounding, repeats, balance. */
  doctor: Checkup;
} & Problems;

/** What the window hears while downloading: the hub's events as they are, then the outcome. */
export type DownloadMessage =
  | ({ kind: "progress" } & HubEvent)
  | {
    kind: "finished";
    state: DownloadState;
    base: BaseModel | null;
  };

/** The download as the window last heard of it. */
export type DownloadState =
  | { state: "idle" }
  | {
    state: "running";
    file: string;
    bytes: number;
    total: number;
  }
  | { state: "done" }
  | {
    state: "failed";
    message: string;
  }
  | {
    state: "cancelled";
    message: string;
  };

export type Evaluation = {
  /**
   * One per expected tool (`(no call)` among them), in name order; none for scores recorded
   * before answers were told apart by kind.
   */
  charts: ToolChart[];
  /** The kinds the charts show, in their stacking order. */
  kinds: KindKey[];
  /** What quantizing and the file cost, once the `.cact` is built and scored. */
  gaps: string | null;
  /** The models' confidence; `None` for scores recorded before it was kept. */
  confidence: ConfidenceView | null;
};

/**
 * One thing that happened during `needle finetune`, in order: `started`, then `step`s with an
 * `epoch` and a `saved` after each epoch, `head_fitted` or `no_head` when a confidence head was
 * asked for, then `finished` — or `failed` at any point.
 */
export type Event =
  | {
    event: "started";
    backend: string;
    device: string;
    /** Training examples (after the validation split). */
    examples: number;
    /** Held-out validation examples. */
    validation: number;
    seq_len: number;
    /** Optimizer updates in the whole run. */
    steps: number;
    warmup: number;
    memory_estimate_bytes: number;
    /** The update the run starts from (non-zero when resumed). */
    first_step: number;
  }
  | {
    event: "step";
    step: number;
    total: number;
    loss: number;
    lr: number;
    tokens_per_s: number;
    eta_s: number;
  }
  | {
    event: "epoch";
    epoch: number;
    /** The loss of the epoch's last batch (the reference prints the same). */
    loss: number;
    /** Mean validation loss over validation batches; `None` without a validation split. */
    val: number | null;
  }
  | {
    event: "saved";
    path: string;
  }
  /** The held-out examples are being answered, to score the calls of the base and tuned models. */
  | {
    event: "scoring";
    examples: number;
  }
  /** The held-out examples could not be scored (the adapter is saved all the same). */
  | {
    event: "unscored";
    message: string;
  }
  /**
   * The confidence head was fitted to the tuned model and saved beside the adapter (after the
   * last `saved`, before `scoring`).
   */
  | {
    event: "head_fitted";
    path: string;
    /** Training rows labelled by the shipped model's answers, and how many it answered right. */
    rows: number;
    right: number;
    /** The area under the ROC curve of the cross-fitted logits (`None` when every label is alike). */
    auroc: number | null;
    /** Whether the fit started from the base's own head. */
    from_base: boolean;
    /** Seconds it took: answering the training rows, collecting their cells, fitting. */
    seconds: number;
  }
  /** No confidence head was fitted, and why (the adapter is saved all the same). */
  | {
    event: "no_head";
    message: string;
  }
  | {
    event: "finished";
    adapter: string;
    seconds: number;
    /** True when the run was cancelled before its last step. */
    partial: boolean;
    /**
     * Exact-call accuracy of the base and tuned models on the held-out examples (the first
     * [`SCORED_EXAMPLES`](super::finetune::SCORED_EXAMPLES)); `None` for a partial run or without a
     * validation split.
     */
    accuracy: CallScores | null;
  }
  | {
    event: "failed";
    message: string;
  };

/**
 * One thing that happened during an export, in order: `stage`s (with `merged` after the merge),
 * then `built` — or `failed` at any point.
 */
export type ExportEvent =
  /** Stage `index` (1-based) of `of` is starting. */
  | {
    event: "stage";
    label: string;
    index: number;
    of: number;
  }
  | {
    event: "merged";
    adapter: string;
    groups: number;
    /** The confidence head trained for this adapter, shipped in place of the base's. */
    head: string | null;
  }
  | {
    event: "built";
    path: string;
    bytes: number;
    tensors: number;
    scheme: string;
  }
  | {
    event: "failed";
    message: string;
  };

/** A case failed, with what was expected and what the model's answer acted on. */
export type FailedCase = {
  query: string;
  category: Category;
  expected: Call[];
  /** The calls acted on, after the checks and the gate. */
  calls: Call[];
  /** The turn's confidence; `None` for a case never answered. */
  confidence: number | null;
  /** Why it failed before its calls were compared (`prompt too long`, `answer cut off`). */
  reason: string | null;
  /** The model's whole answer. */
  text: string;
};

/** An example field whose type is checked. */
export type Field =
  | "query"
  | "reasoning"
  | "system"
  | "tools"
  | "answers"
  | "function_calls";

/** Field name → what is wrong with what was typed there, and how to fix it. */
export type FieldErrors = Record<string, string>;

/** One kind of problem, about one tool and argument where it has them, and the rows that have it. */
export type Finding = {
  kind: Kind;
  severity: Severity;
  tool: string | null;
  argument: string | null;
  /** How many rows (for `few_examples`: calls of the tool). */
  count: number;
  /** The rows' 1-based lines, the first [`KEPT_LINES`]. */
  lines: number[];
  message: string;
};

/**
 * A field as a form shows it: its bounds as an input's `min` and `max` (open ends included: the
 * range check says the rest), its step and its default.
 */
export type FormField = {
  name: string;
  label: string;
  /** `number`, or `switch` (a checkbox; its bounds are null). */
  kind: FormKind;
  whole: boolean;
  min: number | null;
  max: number | null;
  /** An `<input type="number">` step: `1` for whole numbers, else `any`. */
  step: string;
  default: unknown;
};

/** The input a form shows for a field. */
export type FormKind =
  | "number"
  | "switch";

/** What the window hears: each reply's progress, each failed request, then the outcome. */
export type GenerateMessage =
  | {
    kind: "progress";
    state: GenerationState;
  }
  | {
    kind: "request_failed";
    message: string;
  }
  | {
    kind: "finished";
    state: GenerationState;
  };

/** What the window sends: each field as typed. */
export type GenerateRequest = {
  /** The dataset to write more of: its tools are asked for, and its rows come first in the output. */
  dataset: string;
  /** Where the originals and the new rows go [default: `DATA.augmented.jsonl`]. */
  output: string;
  count: string;
  /** [default: the reference's model] */
  model: string;
  /** An OpenAI-compatible chat-completions URL [default: `OPENROUTER_URL`, else OpenRouter's]. */
  endpoint: string;
  /** The share of the new rows that must get no call (0.3 for 30%) [default, empty: the LLM's own mix]. */
  negative_share?: string;
  /** Also write an acceptance suite for the same tools (with a count of 0, the suite alone). */
  suite?: boolean;
  /** Where the suite goes [default, empty: beside the output, as `OUT.suite.json`]. */
  suite_path?: string;
  /** Cases in the suite [default, empty: upstream's 32]. */
  suite_cases?: string;
};

/** What the Generate form starts with. */
export type GenerateSetup = {
  count: number;
  /** Cases in a suite, as upstream's. */
  suite_cases: number;
  model: string;
  /** The endpoint used when the field is left empty. */
  endpoint: string;
  key: KeySource;
  state: GenerationState;
};

/**
 * A generation of the Needle model: which network, file formats and recipe a model belongs to.
 * Told from the file itself ([`crate::checkpoint::generation`], the `.cact` tag).
 */
export type Generation =
  /** `cactus-needle` 2.x: pickled format-v2 checkpoints, `.cact` tag `0x05E12A83`. */
  | "Needle2"
  /** `cactus-needle` 3.x: safetensors checkpoints with the config in their metadata, `.cact` v3. */
  | "Needle3";

/** The generation as the app last heard of it. */
export type GenerationState =
  | { state: "idle" }
  | {
    state: "running";
    generated: number;
    wanted: number;
    failed_requests: number;
    /** Rows not kept so far, by reason (the doctor's kinds, `duplicate_row`, ...). */
    rejected: Record<string, number>;
    /** Cancel was pressed: what arrived is being written. */
    stopping: boolean;
    /** The suite's cases so far, once the rows are written and the suite is being asked for. */
    suite: SuiteProgress | null;
  }
  | ({ state: "written" } & Outcome)
  | {
    state: "failed";
    message: string;
  };

/**
 * Rows longer than the previous bin's `up_to` and at most this one's; the bounds are the
 * sequence lengths `fit_max_len` can pick (128, 256, 512, ...).
 */
export type HistogramBin = {
  up_to: number;
  count: number;
};

/** One training as the History panel lists it. */
export type HistoryEntry = {
  id: string;
  /** Unix seconds. */
  started_at: number;
  /** What was asked for; Resume asks for it again. */
  request: TrainingRequest;
  /** The backend and device the worker reported, e.g. `cpu (AMD EPYC)`. */
  backend: string | null;
  status: TrainingStatus;
  seconds: number | null;
  steps_done: number;
  steps: number;
  final_loss: number | null;
  final_val: number | null;
  /** Set once the worker has saved one (after the first epoch, or at a cancel). */
  adapter: string | null;
  /** Why a training failed or stopped. */
  message: string | null;
  /** The whole model's built file: the one Evaluate scores and Publish uploads. */
  cact: CactInfo | null;
  /**
   * Rungs of the model's depth ladder built as files of their own, beside the whole model's, never
   * in its place.
   */
  rungs?: CactInfo[];
  /** Held-out loss and exact-call accuracy of the base and the tuned model, when the training finished. */
  scores?: CallScores | null;
  /** Where Build writes unless the user picks another file. */
  suggested_cact: string;
  /**
   * The confidence a turn needs for its calls to be acted on, as the user picked it in Evaluate;
   * written beside the built `.cact` too.
   */
  threshold?: number | null;
  /** The last acceptance suite run on the training's models. */
  acceptance?: Acceptance | null;
  /**
   * Whether Resume can continue it: it ended early with its training state saved. Derived
   * when the entry is listed, never stored.
   */
  resumable?: boolean;
};

/**
 * Progress of fetching files from the hub (or pushing one to it), rendered as a bar by the CLI and
 * the app and printed as JSON lines by `needle download --events jsonl` (and `needle build --upload
 * --events jsonl`), like training's events.
 */
export type HubEvent =
  /** The file is in the cache: nothing was asked of the network. */
  | {
    event: "cached";
    file: string;
    path: string;
    bytes: number;
  }
  /** A transfer starts; `resumed_from` bytes are already on disk from an earlier, cut one. */
  | {
    event: "started";
    file: string;
    total: number;
    resumed_from: number;
  }
  /** Bytes on disk so far (resumed ones included), or sent so far, with the rate of this transfer. */
  | {
    event: "progress";
    file: string;
    bytes: number;
    total: number;
    bytes_per_s: number;
    eta_s: number;
  }
  /** The file arrived whole, matched the hub's size and hash, and is in the cache at `path`. */
  | {
    event: "downloaded";
    file: string;
    path: string;
    bytes: number;
  }
  /** A push starts: `total` bytes of a local file go to `file` (`org/model/path`). */
  | {
    event: "uploading";
    file: string;
    total: number;
  }
  /** The file is committed to its repository. */
  | ({ event: "uploaded" } & Uploaded)
  | {
    event: "failed";
    message: string;
  };

/** Why the hub could not say what a download would fetch. */
export type HubTrouble = {
  /**
   * The hub cannot be reached (no connection, or `HF_HUB_OFFLINE` set): the panel says "offline" in
   * one line rather than one message per model.
   */
  offline: boolean;
  /** The whole message (the address, the cause, the way around), which the panel keeps folded. */
  details: string;
};

/** A bootstrap percentile interval. */
export type Interval = {
  low: number;
  high: number;
};

/** One thing wrong with one line. */
export type Issue =
  /** Bytes that are not UTF-8, first bad one at `column` (1-based, in characters). */
  | {
    kind: "not_utf8";
    column: number;
  }
  /** The line starts with U+FEFF, which Python's `json.loads` rejects. */
  | { kind: "byte_order_mark" }
  | {
    kind: "invalid_json";
    column: number;
    reason: string;
  }
  /**
   * `NaN`/`Infinity`/`-Infinity` at `column`: Python's json reads them (so the reference trains
   * on the line), standard JSON and we do not.
   */
  | {
    kind: "non_finite_number";
    column: number;
  }
  /** Valid JSON, but not an object; `found` names what it is ("a list", ...). */
  | {
    kind: "not_an_object";
    found: string;
  }
  | { kind: "missing_query" }
  /** Neither a `query` nor a single-turn chat (`messages`): Needle 3's package skips it. */
  | { kind: "not_chat" }
  /** A chat line Needle 3's package cannot read (it would crash). */
  | {
    kind: "bad_chat";
    reason: string;
  }
  /** A field the template concatenates as text holds something else (the reference crashes). */
  | {
    kind: "not_a_string";
    field: Field;
    found: string;
  }
  /**
   * `tools`/`answers` is neither a list nor a string: kept and rendered as its JSON text,
   * as the reference does, but probably not what was meant.
   */
  | {
    kind: "rendered_as_json";
    field: Field;
    found: string;
  }
  /** `system` is a non-string that Python treats as false: kept, with no system turn. */
  | {
    kind: "system_ignored";
    found: string;
  }
  /** The encoded example is longer than the run's sequence length and was cut at the end. */
  | {
    kind: "truncated";
    tokens: number;
    seq_len: number;
    target_tokens: number;
    target_tokens_kept: number;
  };

/** Where a secret comes from. */
export type KeySource =
  /** The app's environment has it (the first of its variables that is set). */
  | {
    source: "environment";
    variable: string;
  }
  /** Typed once, kept in the operating system's keychain. */
  | { source: "keychain" }
  /** Typed, kept in memory until the app closes: this system offers no keychain (`note` says why). */
  | {
    source: "session";
    note: string;
  }
  /** None yet: the window asks for one. */
  | { source: "none" };

/** What is wrong with one row, by kind; the doctor counts and words them. */
export type Kind =
  /** `answers` is not a JSON list (or a JSON string holding one). */
  | "unreadable_answers"
  /** An entry of `answers` is not `{"name": "...", "arguments": {...}}`. */
  | "not_a_call"
  /** A call names a tool its row does not offer. */
  | "unknown_tool"
  /** A call leaves out an argument its tool requires. */
  | "missing_argument"
  /** A call gives an argument its tool does not declare. */
  | "unknown_argument"
  /** An argument's value is not of its declared type. */
  | "wrong_type"
  /** An argument's value is not one its declared `enum` allows. */
  | "not_in_enum"
  /** The same query (case aside) with the same answers as an earlier row. */
  | "duplicate_row"
  /** The row does not fit the sequence length: its end, the answer, is cut off. */
  | "too_long"
  /** An argument's value appears nowhere in the query. */
  | "ungrounded"
  /** The same words as an earlier row's query, in another order, case or punctuation. */
  | "near_duplicate"
  /**
   * No row calls nothing: the file never teaches the model to hold back (ahead of the counts
   * below: a model that always calls acts on requests it should refuse).
   */
  | "no_restraint"
  /** A tool that is offered but called in too few rows to learn. */
  | "few_examples"
  /** Most rows call nothing. */
  | "mostly_no_call";

/** A kind as the page names and colours it. */
export type KindKey = {
  kind: AnswerKind;
  label: string;
  /** `#rrggbb`. */
  color: string;
};

/** Every rung asked for, shallowest first. */
export type Ladder = {
  /** The full depth of the model the rungs are cut from. */
  num_layers: number;
  /** The held-out examples each rung answered. */
  examples: number;
  rungs: Rung[];
};

/**
 * One thing that happened during a sweep, in order: `started`; for each rung `rung`, then an
 * `answered` per example, then `scored`; last `finished` — or `cancelled` (no table: a partial
 * ladder would rank rungs it never tried) or `failed` at any point.
 */
export type LadderEvent =
  | {
    event: "started";
    /** The depths to score, in the order they will be. */
    rungs: number[];
    examples: number;
  }
  /** Rung `index` (1-based) of `of` is being built. */
  | {
    event: "rung";
    layers: number;
    index: number;
    of: number;
  }
  | {
    event: "answered";
    layers: number;
    done: number;
    total: number;
  }
  | {
    event: "scored";
    rung: Rung;
  }
  | {
    event: "finished";
    ladder: Ladder;
  }
  | {
    event: "cancelled";
    /** The rungs scored before the cancel. */
    scored: number;
  }
  | {
    event: "failed";
    message: string;
  };

/** What the window hears about a sweep. */
export type LadderMessage =
  /** The worker's `started`, `rung`, `answered` and `scored` events, as they are. */
  | ({ kind: "progress" } & LadderEvent)
  /** Every rung scored, and the chart of their exact calls. */
  | {
    kind: "finished";
    ladder: Ladder;
    svg: string;
  }
  | { kind: "cancelled" }
  | {
    kind: "failed";
    message: string;
  };

export type LengthStats = {
  min: number;
  median: number;
  max: number;
};

export type ModelConfidence = {
  model: string;
  figures: Reliability;
};

/** One model on a set of examples: the answer loss (as `needle eval`) and the calls it makes. */
export type ModelScore = {
  loss: number;
  calls: Accuracy;
  /**
   * The examples it answered wrong, what was expected beside what it gave (for the app's
   * Evaluate step; runs recorded before it was kept have none).
   */
  wrong?: Answered[];
};

/** A past training reopened: its record and its chart. */
export type Opened = {
  entry: HistoryEntry;
  chart: string | null;
};

/** What a generation wrote: the rows, the suite, or both. */
export type Outcome = {
  /** The dataset's file (its rows, then the new ones); none when the suite alone was asked for. */
  data: Written | null;
  /** The acceptance suite, where one was asked for and written. */
  suite: SuiteWritten | null;
  /** Why the suite asked for was not written, where the rows were. */
  suite_failed: string | null;
};

/** What a run will do, known before it starts (`--dry-run` prints it). */
export type Plan = {
  examples: number;
  validation: number;
  seq_len: number;
  steps_per_epoch: number;
  steps: number;
  warmup: number;
  adapted_weights: number;
  trainable_parameters: number;
  /** Predicted peak resident memory of the run (see [`super::memory`]). */
  memory_estimate_bytes: number;
  /** Whether steps recompute activations layer by layer to stay within that memory. */
  recompute: boolean;
  /**
   * Rows per forward and backward pass at the longest rows (a batch with more is split, its
   * gradients summed).
   */
  micro_batch: number;
  /** Packed tokens per pass (shared prefixes counted once). */
  tokens_per_pass?: number;
  /** Memory the machine has free now, where the platform says. */
  memory_available_bytes: number | null;
  /**
   * Predicted seconds for the whole run, from a timed step ([`Session::time_run`]); absent
   * until timed.
   */
  seconds_estimate: number | null;
};

export type Preferences = {
  checkpoint: string | null;
  tokenizer: string | null;
  /**
   * The published base model chosen by Download or Use (the default generation until one is); the
   * window's own save leaves it out.
   */
  generation?: Generation;
  /** `auto`, or a backend forced by the user. */
  device: string;
  preset: string;
  /**
   * A training that took at least this many seconds ends with a desktop notification: the user
   * has probably looked away. Kept in the file, not a field of the window.
   */
  notify_after_s?: number;
};

/**
 * A named set of [`TrainSettings`]: what the app's Run panel offers as one click and
 * `needle finetune --preset` fills before any flag given beside it.
 */
export type Preset = {
  name: string;
  label: string;
  description: string;
  settings: TrainSettings;
};

/** An [`Issue`] on a 1-based line of the file. */
export type Problem = { line: number; issue: Issue; skipped: boolean; message: string };

/**
 * The problems of a file: the first [`KEPT_PROBLEMS`] in line order, and how many of each kind
 * there are in all. Dereferences to the kept ones.
 *
 * Serialized flat into a report: `problems` (the kept ones), `problem_counts`, `problems_total`.
 */
export type Problems = {
  problems: Problem[];
  /** Every problem, kept or not, by [`Issue::kind`]. */
  problem_counts: Record<string, number>;
  problems_total: number;
};

/** What the window hears: the hub's events as they are, then the outcome. */
export type PublishMessage =
  | ({ kind: "progress" } & HubEvent)
  | {
    kind: "finished";
    state: PublishState;
  };

/** What the Publish form starts with. */
export type PublishSetup = {
  /** `NEEDLE_HF_REPO`, when it is set. */
  repo: string | null;
  token: KeySource;
  state: PublishState;
};

/** The upload as the app last heard of it. */
export type PublishState =
  | { state: "idle" }
  | {
    state: "running";
    file: string;
    bytes: number;
    total: number;
  }
  | ({ state: "published" } & Uploaded)
  /** Stopped before the commit: the message says what (if anything) is left on the hub. */
  | {
    state: "cancelled";
    message: string;
  }
  | {
    state: "failed";
    message: string;
  };

/**
 * The tuned model three ways on the same examples, so that a gap has a cause: as trained (float),
 * with the deployment's quantization simulated ([`Precision::Simulated`]: what quantizing costs),
 * and its built `.cact` read back and run the same way, 8-bit activations and all (what the file
 * adds to that).
 */
export type QuantRows = {
  float: ModelScore;
  simulated: ModelScore;
  cact: ModelScore;
};

/** What the window asks. */
export type Question = {
  /** The training whose adapter answers beside the base; `None` asks the base model alone. */
  training_id?: string | null;
  /** The tool schemas, as JSON text (a list). */
  tools: string;
  query: string;
  system?: string;
};

/**
 * The first reason found not to act on a call. `argument` is a path into the call's arguments:
 * `room`, `items[0].name`.
 */
export type Reason =
  /** Not `{"name": "...", "arguments": {...}}`. */
  | { reason: "not_a_call" }
  /** A tool the turn does not offer. */
  | {
    reason: "unknown_tool";
    tool: string;
  }
  /** An argument its tool requires is left out. */
  | {
    reason: "missing_argument";
    argument: string;
  }
  /** An argument its tool does not declare (a tool's function would refuse it). */
  | {
    reason: "unknown_argument";
    argument: string;
  }
  /** A value not of the declared `type`. */
  | {
    reason: "wrong_type";
    argument: string;
    expected: unknown;
    given: unknown;
  }
  /** A value outside the declared `enum`. */
  | {
    reason: "not_in_enum";
    argument: string;
    allowed: unknown[];
    given: unknown;
  }
  /** A number outside `minimum`, `maximum`, `exclusiveMinimum` or `exclusiveMaximum`. */
  | {
    reason: "out_of_bounds";
    argument: string;
    bound: Bound;
    limit: unknown;
    given: unknown;
  }
  /**
   * A date whose year neither the query nor the system prompt licenses (cactus-needle 3.x's
   * `_annotate_ungrounded`).
   */
  | {
    reason: "ungrounded_year";
    argument: string;
    year: number;
  }
  /**
   * Withheld with its turn: another call of it carries an ungrounded year, and the reference's
   * harness then acts on no call of the turn.
   */
  | { reason: "ungrounded_turn" }
  /** The turn's confidence is below the gate, so no call of it is acted on. */
  | {
    reason: "below_confidence";
    min_confidence: number;
  };

/** The figures over a set of answers. */
export type Reliability = {
  answers: number;
  /** How many are exact. */
  right: number;
  /**
   * The chance that a right answer has a higher confidence than a wrong one (ties count half);
   * `None` when the answers are all right or all wrong.
   */
  auroc: number | null;
  /** Its bootstrap interval ([`COVERAGE`]); `None` with it. */
  auroc_interval: Interval | null;
  /**
   * Expected calibration error: over the [`BINS`], each bin's share of the answers times how far
   * its mean confidence is from its share right.
   */
  ece: number;
  ece_interval: Interval;
  /** The reliability table, one row per bin, empty ones too. */
  bins: Bin[];
  /** What a gate at each threshold keeps and stops. */
  tradeoff: Tradeoff[];
  /**
   * The highest threshold of the table that stops at most [`MAX_RIGHT_STOPPED`] of the right
   * answers: the gate an app is offered first.
   */
  proposed: number;
};

/**
 * What a row teaches, as far as the row itself tells: by its number of calls. A row with no call
 * may answer a request missing a required value, one no tool serves, a negated one or one outside a
 * tool's bounds (an acceptance suite's missing, irrelevant, negation and invalid cases), but its
 * answer is the same empty list for all four and nothing in the row says which it is: they are one
 * category here.
 */
export type RowCategory =
  /** One call. */
  | "positive"
  /** Two calls or more. */
  | "parallel"
  /** An empty list of calls: the model holds back. */
  | "no_call";

/** One rung scored. */
export type Rung = {
  /** Its depth: the blocks it keeps. */
  layers: number;
  /** The size of its `.cact`. */
  cact_bytes: number;
  /**
   * Its calls on the held-out examples, run as the `.cact` runs: exact calls, why the others
   * are wrong, and its decoding speed here ([`Accuracy::decode_tokens_per_s`]).
   */
  calls: Accuracy;
};

export type Sample = {
  line: number;
  /** The texts below are cut at `SAMPLE_CHARS` characters, each marked where it was cut. */
  prompt: string;
  target: string;
  tokens: number;
  /** The example's tools and query as they were written, to try a model with. */
  tools: string;
  query: string;
};

/** Which secret the window means. */
export type SecretName =
  | "generate_key"
  | "hub_token";

export type Severity =
  /** `--fix` leaves these rows out. */
  | "error"
  /** Worth a look; the rows stay. */
  | "advice";

/** Everything the window shows when it opens. */
export type Startup = {
  hardware: BackendInfo;
  devices: string[];
  preferences: Preferences;
  dataset: string | null;
  presets: Preset[];
  /** The Train panel's fields: names, labels, ranges and the reference's defaults. */
  training_fields: FormField[];
  /** The widths Build offers. */
  build_widths: BuildWidth[];
  history: HistoryEntry[];
};

/** The suite's cases so far (the worker's `suite_progress` line). */
export type SuiteProgress = {
  cases: number;
  wanted: number;
  failed_requests: number;
  /** Cases not kept so far, by reason (`ungrounded`, `repeated_query`, ...). */
  rejected: Record<string, number>;
};

/** One model on the suite. */
export type SuiteScore = {
  /** `Base`, `Tuned` or `.cact`. */
  model: string;
  passed: number;
  total: number;
  /** The passes the contract needs: `round(0.9 × total)`. */
  required: number;
  critical_failures: number;
  /** Enough passes and no critical failure. */
  contract: boolean;
  /** Each category the suite has, in the categories' order. */
  categories: CategoryScore[];
  /** The critical cases failed, in file order. */
  critical: FailedCase[];
};

/** The suite is written (the worker's `suite_written` line). */
export type SuiteWritten = {
  path: string;
  cases: number;
  /**
   * Cases asked for and written, per category (no invalid one asked for when no tool has an enum
   * or a bound).
   */
  wanted: Record<string, number>;
  written: Record<string, number>;
  failed_requests: number;
  rejected: Record<string, number>;
  /** Stopped by Cancel before the suite was whole. */
  cancelled: boolean;
};

export type ToolChart = {
  tool: string;
  /** SVG markup. */
  svg: string;
};

export type ToolScore = {
  right: number;
  total: number;
};

/**
 * A gate at `threshold`: the share of right answers it keeps (confidence ≥ threshold) and of
 * wrong ones it stops (below it); `None` where there are no such answers.
 */
export type Tradeoff = {
  threshold: number;
  kept_right: number | null;
  stopped_wrong: number | null;
};

/** The hyper-parameters of a fine-tuning run. The keys are [`TRAIN_FIELDS`]' names. */
export type TrainSettings = {
  epochs: number;
  lr: number;
  rank: number;
  alpha: number;
  batch_size: number;
  max_len: number;
  val_split: number;
  seed: number;
  /**
   * Train quantization-aware where the generation's recipe does not (Needle 2): see the
   * field's help. Settings recorded before it was kept read as off.
   */
  qat?: boolean;
};

/** A training as the UI sends it: each setting as typed (text, or a number), possibly missing or wrong. */
export type TrainingDraft = {
  dataset?: string | null;
  checkpoint?: string | null;
  tokenizer?: string | null;
  device?: string | null;
  settings?: Record<string, unknown>;
};

/** What the window hears about a training. */
export type TrainingMessage =
  /** The worker's `started`, `step` and `epoch` events, as they are. */
  | ({ kind: "progress" } & Event)
  /** The loss chart, redrawn. */
  | {
    kind: "chart";
    svg: string;
  }
  | {
    kind: "log";
    line: string;
  }
  | {
    kind: "finished";
    entry: HistoryEntry;
  }
  | {
    kind: "failed";
    message: string;
    entry: HistoryEntry;
  };

/** A checked training: what it trains on, from which base, where, and how. */
export type TrainingRequest = {
  dataset: string;
  checkpoint: string;
  tokenizer: string;
  device: string;
  settings: TrainSettings;
};

export type TrainingStatus =
  | "running"
  | "finished"
  /** Cancelled: the adapter holds what was learned up to the stop. */
  | "stopped"
  | "failed"
  /** Cut short by the app closing (or dying) while it went. */
  | "interrupted";

/** One model's answer, as `needle run --json` prints it, its withheld calls worded. */
export type TryAnswer = {
  text: string;
  /**
   * The calls acted on (those that pass the tools' schemas and the grounding check); `None` when
   * the answer has no parseable `<tool_call>` list.
   */
  calls: unknown[] | null;
  /** The calls the checks held back, each with why. */
  withheld: WithheldCall[];
  /** How sure the model is of the turn, in [0, 1]. */
  confidence: number;
  tokens_per_s: number;
  /** Why decoding stopped (`end_of_turn`, `eos`, `max_new_tokens`, `max_length`). */
  stop: string;
};

/** A file committed to a repository on the hub. */
export type Uploaded = {
  /** `org/model/path`, as [`RepoFile::name`] writes it. */
  file: string;
  bytes: number;
  /** The repository's page on the hub. */
  url: string;
  /** The commit that added the file; `None` when the repository already held these bytes there. */
  commit: string | null;
};

/** One answer judged against the expected calls. */
export type Verdict =
  | { kind: "exact" }
  | { kind: "unreadable_expected" }
  | { kind: "unparseable" }
  /** The calls held back, each with why. */
  | {
    kind: "withheld";
    withheld: Withheld[];
  }
  | { kind: "false_fire" }
  | { kind: "false_refusal" }
  | {
    kind: "wrong_count";
    expected: number;
    given: number;
  }
  /** The first call (from 0, in the order written) that names another tool. */
  | {
    kind: "wrong_tool";
    call: number;
    expected: string;
    given: string;
  }
  /** Every difference of every call, in call order. */
  | {
    kind: "wrong_arguments";
    differences: ArgumentDiff[];
  };

/** A call the checks hold back: the call as the model wrote it, and the first reason found. */
export type Withheld = {
  call: unknown;
} & Reason;

/** A call the checks held back, and why in words. */
export type WithheldCall = {
  call: unknown;
  why: string;
};

/** The file is written: the originals, then the new rows. */
export type Written = {
  path: string;
  /** Rows in the file. */
  written: number;
  /** New rows among them (the last ones). */
  generated: number;
  wanted: number;
  failed_requests: number;
  rejected: Record<string, number>;
  /** Kept rows the doctor has advice about, by kind. */
  advice: Record<string, number>;
  /** Stopped by Cancel before the count was reached. */
  cancelled: boolean;
  /** The first new rows, as written. */
  rows?: unknown[];
};
