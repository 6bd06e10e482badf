// The detectors, one entry each. A new detector is its own file here (a DetectorSpec: name,
// parameters, the per-step pass it fills) plus its part of native/detector_pass.cc, and one line
// below. The config schema and its types (config.ts), the guard's detector set (index.ts), the
// agents' AgentConfig (agent-config.ts), the demo's expectations and the docs' list all read this.
import { GARBLED } from './garbled';
import { LOGITS_FINITE } from './logits-finite';
import { SPEC_ACCEPTANCE } from './spec-acceptance';
import type { DetectorSpec } from './spec';
import { TOKEN_REPEAT } from './token-repeat';
import { RANK_DIVERGENCE } from './rank-divergence';

/** In the order runtime_config.json, reports and the docs list them. */
export const DETECTORS = [TOKEN_REPEAT, LOGITS_FINITE, SPEC_ACCEPTANCE, GARBLED, RANK_DIVERGENCE] as const;

type Spec = (typeof DETECTORS)[number];
type ConfigOf<S> = S extends DetectorSpec<string, infer C> ? C : never;

export type DetectorName = Spec['name'];
/** runtime_config.json's `detector` object: each detector's config under its name. */
export type DetectorConfigs = { [S in Spec as S['name']]: ConfigOf<S> };

export const DETECTOR_NAMES: readonly DetectorName[] = DETECTORS.map((d) => d.name);

/** The spec of `name`. */
export function detectorSpec(name: DetectorName): DetectorSpec {
  return DETECTORS.find((d) => d.name === name) as DetectorSpec;
}
