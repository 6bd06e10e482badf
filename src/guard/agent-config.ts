// The one place the runtime config becomes what the ranks act on (proto AgentConfig): built from
// the validated RuntimeConfig, whose defaults live in config.ts only. The agent reads it as it is
// (src/agent/runtime-view.ts) and re-derives nothing.
import { tensorFormatToProto } from '../artifacts/tensor-format';
import type { AgentConfig } from '../messages';
import { DETECTOR_NAMES, type RuntimeConfig } from './config';
import { sensitiveToProto } from './recorder-config';

/** What the ranks need beside the config: startup switches the config file does not hold. */
export interface AgentConfigFacts {
  /** The coordinator follows the config file (runtime_config_hot_reload). */
  hotReload: boolean;
  /** The resolved dump root (dump.dump_dir or the startup one); '' when not known. */
  dumpRoot: string;
}

export function agentConfig(cfg: RuntimeConfig, facts: AgentConfigFacts): AgentConfig {
  const detectors = DETECTOR_NAMES.filter((name) => cfg.detector[name].enabled);
  return {
    // Any of these needs the per-wave vector; with none of them the ranks leave the bus alone.
    busActive: facts.hotReload || detectors.length > 0 || cfg.dump.manual_dump > 0,
    hotReload: facts.hotReload,
    detectors,
    itemSync: cfg.detector.logits_finite.item_sync,
    dumpFormat: tensorFormatToProto(cfg.dump.format),
    freeHeadroomBytes: cfg.dump.free_headroom_bytes,
    dumpRoot: facts.dumpRoot,
    allPpStages: cfg.dump.pp_stages === 'all',
    recorderOn: [...cfg.recorder.on],
    recorderForwards: cfg.recorder.forwards,
    recorderMaxBytes: cfg.recorder.max_bytes,
    saveSensitiveInfo: sensitiveToProto(cfg.report.save_sensitive_info),
    verdictAuto: cfg.verdict.auto,
    verdictAllowLiveDevice: cfg.verdict.allow_live_device,
  };
}
