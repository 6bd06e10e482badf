// What the agent acts on from the coordinator's runtime config (proto AgentConfig, built by
// src/guard/agent-config.ts). Read as it is: no defaults are re-derived here.
import { tensorFormatFromProto } from '../artifacts/tensor-format';
import { agentConfig } from '../guard/agent-config';
import { defaultConfig } from '../guard/config';
import { RECORDER_TRIGGERS, sensitiveFromProto, type RecorderTrigger, type SensitiveInfo } from '../guard/recorder-config';
import type { AgentConfig } from '../messages';
import type { DumpFormat } from './dump-executor';

export interface RuntimeView {
  busActive: boolean;
  hotReload: boolean;
  /** The enabled detectors, by config name. */
  detectors: readonly string[];
  itemSync: boolean;
  format: DumpFormat;
  freeHeadroomBytes: number;
  dumpRoot?: string;
  /** dump.pp_stages: "all" puts every stage's ranks (not only the last's) on the wave vector. */
  ppStages: 'last' | 'all';
  /** recorder.on (names this side does not know are left out); forwards / maxBytes 0: no wish. */
  recorder: { on: readonly RecorderTrigger[]; forwards: number; maxBytes: number };
  /** report.save_sensitive_info: what the recorder's files keep of token ids and messages. */
  sensitive: SensitiveInfo;
  /** verdict.auto: this replica's head runs `wavebus verdict` after an incident flush (src/agent/auto-verdict.ts). */
  verdict: { auto: boolean; allowLiveDevice: boolean };
}

/** The view of a config as the agent receives it. Throws ProtocolError on a TensorFormat this side does not know. */
export function runtimeView(cfg: AgentConfig): RuntimeView {
  return {
    busActive: cfg.busActive,
    hotReload: cfg.hotReload,
    detectors: [...cfg.detectors],
    itemSync: cfg.itemSync,
    format: tensorFormatFromProto(cfg.dumpFormat, 'AgentConfig.dump_format'),
    freeHeadroomBytes: cfg.freeHeadroomBytes,
    dumpRoot: cfg.dumpRoot || undefined,
    ppStages: cfg.allPpStages ? 'all' : 'last',
    recorder: {
      on: RECORDER_TRIGGERS.filter((t) => (cfg.recorderOn ?? []).includes(t)),
      forwards: Number(cfg.recorderForwards ?? 0),
      maxBytes: Number(cfg.recorderMaxBytes ?? 0),
    },
    sensitive: sensitiveFromProto(cfg.saveSensitiveInfo, 'AgentConfig.save_sensitive_info'),
    verdict: { auto: Boolean(cfg.verdictAuto), allowLiveDevice: Boolean(cfg.verdictAllowLiveDevice) },
  };
}

/**
 * Before the coordinator sent a config (or when it has none): the defaults of src/guard/config.ts
 * (everything off), through the same builder the coordinator uses.
 */
export const DEFAULT_VIEW: Readonly<RuntimeView> = Object.freeze(runtimeView(agentConfig(defaultConfig(), { hotReload: false, dumpRoot: '' })));

/** The view of a config from the coordinator; none (null) gives DEFAULT_VIEW. */
export function viewOf(cfg: AgentConfig | null | undefined): RuntimeView {
  return cfg ? runtimeView(cfg) : { ...DEFAULT_VIEW };
}
