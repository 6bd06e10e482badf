// What the agent acts on from the coordinator's runtime config (the guard's effective config, as JSON).
import type { DumpFormat } from './dump-executor';

/** Runtime config fields the agent acts on (the guard's effective config, as JSON). */
export interface RuntimeView {
  busActive: boolean;
  hotReload: boolean;
  detectors: Record<string, boolean>;
  itemSync: boolean;
  format: DumpFormat;
  freeHeadroomBytes: number;
  dumpRoot?: string;
  /** dump.pp_stages: "all" puts every stage's ranks (not only the last's) on the wave vector. */
  ppStages: 'last' | 'all';
}

export const DEFAULT_VIEW: RuntimeView = { busActive: false, hotReload: false, detectors: {}, itemSync: false, format: 'pt', freeHeadroomBytes: 5 * 2 ** 30, ppStages: 'last' };

/** Reads what the agent needs from the coordinator's config JSON; unknown shapes fall back to off. */
export function runtimeView(configJson: string): RuntimeView {
  if (!configJson) return { ...DEFAULT_VIEW };
  let doc: any;
  try {
    doc = JSON.parse(configJson);
  } catch {
    return { ...DEFAULT_VIEW };
  }
  const cfg = doc?.config ?? doc;
  const detectors: Record<string, boolean> = {};
  for (const [name, d] of Object.entries<any>(cfg?.detector ?? {})) detectors[name] = Boolean(d?.enabled);
  const anyDetector = Object.values(detectors).some(Boolean);
  const hotReload = Boolean(doc?.hot_reload);
  const manual = Number(cfg?.dump?.manual_dump ?? 0) > 0;
  return {
    busActive: hotReload || anyDetector || manual,
    hotReload,
    detectors,
    itemSync: Boolean(cfg?.detector?.logits_finite?.item_sync),
    format: (['pt', 'npy', 'safetensors'].includes(cfg?.dump?.format) ? cfg.dump.format : 'pt') as DumpFormat,
    freeHeadroomBytes: Number.isFinite(cfg?.dump?.free_headroom_bytes) ? Number(cfg.dump.free_headroom_bytes) : DEFAULT_VIEW.freeHeadroomBytes,
    dumpRoot: typeof cfg?.dump?.dump_dir === 'string' ? cfg.dump.dump_dir : undefined,
    ppStages: cfg?.dump?.pp_stages === 'all' ? 'all' : 'last',
  };
}
