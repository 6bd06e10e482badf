// What the coordinator publishes for the guard: its effective config, plus the startup facts the
// ranks need to decide whether to use the bus at all (hot reload is a startup switch, not a
// config field, so it travels beside the config: {"hot_reload": bool, "config": {...}}).
import type { CoordinatorPolicy, DueLanes } from '../bus/policy';
import type { DumpResult, StepTelemetry } from '../messages';

export function laneJson(configJson: string, hotReload: boolean): string {
  return `{"hot_reload":${hotReload ? 'true' : 'false'},"config":${configJson || '{}'}}`;
}

export function withStartupFacts(policy: CoordinatorPolicy, hotReload: boolean): CoordinatorPolicy {
  return {
    ledger: policy.ledger,
    onWaveHead(replica: number, wave: number, telemetry: StepTelemetry | null): DueLanes {
      const due = policy.onWaveHead(replica, wave, telemetry);
      if (due.config) due.config = { version: due.config.version, configJson: laneJson(due.config.configJson, hotReload) };
      return due;
    },
    onDumpResult: (r: DumpResult) => policy.onDumpResult?.(r),
    onDumpTimeout: (jobId: string, missing: number[]) => policy.onDumpTimeout?.(jobId, missing),
    status: () => ({ ...policy.status(), hot_reload: hotReload }),
    snapshotState(replica: number) {
      const s = policy.snapshotState(replica);
      return { ...s, configJson: laneJson(s.configJson, hotReload) };
    },
    close: () => policy.close?.(),
  };
}
