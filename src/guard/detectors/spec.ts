// What a detector is to the rest of wavebus: its name, its parameters in runtime_config.json, and
// (for one that runs on every step) how it sits on the native pass. Each detector's file exports
// one DetectorSpec; registry.ts lists them, and the config schema, the guard's detector set, the
// agents' config and the demo read the list.
import type { DetectorCommon, Field } from '../config-schema';

/** A per-step detector on the native pass (native/detector_pass.cc), built from its config. */
export interface PerStepDetector {
  /** int32 words of its header in a request's record (even: float64s inside stay aligned). */
  readonly headerWords: number;
  /** int32 words of its body (even). */
  readonly bodyWords: number;
  /** Its parameters into the pass's parameter block, its header at word `head` and body at `body`. */
  fill(p: Float64Array, head: number, body: number): void;
  /** Token ids the pass skips as content (token_repeat's ignore_token_ids; the pass takes one list). */
  readonly ignore?: Uint32Array;
  /** The alert (the report's detail) from a hit's figures: HIT_WORDS doubles, after row and type. */
  detail(h: Float64Array, at: number): object;
}

export interface DetectorSpec<N extends string = string, C extends DetectorCommon = DetectorCommon> {
  /** As runtime_config.json, reports, dump dirs and metrics spell it (`detector.<name>`). */
  readonly name: N;
  /** Its own parameters (schema and defaults), beside the shared enabled / on_trigger / dump_kv. */
  readonly params: Record<string, Field>;
  /**
   * Builds it on the native pass when it is enabled; absent for a detector fed otherwise
   * (logits_finite: the engine client sends the non-finite rows it found).
   */
  readonly perStep?: (cfg: C) => PerStepDetector;
  /** Never set: carries the type of its config (`detector.<name>`) to the registry. */
  readonly configType?: C;
}
