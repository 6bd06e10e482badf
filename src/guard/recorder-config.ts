// The runtime config's `recorder` key (docs/recorder.md): when the flight recorder writes its ring
// out (`on`, live), a user flush (`flush`, a watermark like dump.manual_dump), and the ring's size
// (`forwards`, `max_bytes`), which only the agent's startup sets (WAVEBUS_RECORD_FORWARDS /
// WAVEBUS_RECORD_MAX_BYTES: the ring is a shm file the engine maps once). Also how the agents
// receive report.save_sensitive_info (proto SensitiveInfo), which the recorder's files follow.
import { ProtocolError } from '../errors';
import { enumValues } from '../proto';
import { int, type Field } from './config-schema';

/** Slots at most (each is a copy of every input of one forward). */
export const MAX_RECORD_FORWARDS = 4096;
/** The ring's data bytes at most: it lives in the run dir (tmpfs). */
export const MAX_RECORD_BYTES = 64 * 2 ** 30;

/**
 * When the ring is written out: "crash" (the engine died), "incident" (an incident's KV dump is
 * copied on the rank), "flush" (a user asked: `wavebus capture --flush-recorder` or a
 * recorder.flush raise).
 */
export const RECORDER_TRIGGERS = ['crash', 'incident', 'flush'] as const;
export type RecorderTrigger = (typeof RECORDER_TRIGGERS)[number];

export interface RecorderConfig {
  /** 0: as the agent started. Another value than the ring's is logged, never applied (restart). */
  forwards: number;
  max_bytes: number;
  on: RecorderTrigger[];
  /** Watermark: each raise by 1 is one flush of every rank's ring (the capture path). */
  flush: number;
}

export const RECORDER_FIELDS: Field = {
  kind: 'object',
  fields: {
    forwards: int(0, 0, MAX_RECORD_FORWARDS),
    max_bytes: int(0, 0, MAX_RECORD_BYTES),
    on: { kind: 'enum_list', def: [...RECORDER_TRIGGERS], values: RECORDER_TRIGGERS },
    flush: int(0, 0),
  },
};

export type SensitiveInfo = boolean | 'hashed';
const WIRE = enumValues('SensitiveInfo');

export function sensitiveToProto(v: SensitiveInfo): number {
  return v === 'hashed' ? WIRE.SENSITIVE_INFO_HASHED : v ? WIRE.SENSITIVE_INFO_ON : WIRE.SENSITIVE_INFO_OFF;
}

/** A number this version does not know (a newer peer) is refused, naming `field`. */
export function sensitiveFromProto(n: unknown, field: string): SensitiveInfo {
  if (n === WIRE.SENSITIVE_INFO_OFF || n === undefined || n === null) return false;
  if (n === WIRE.SENSITIVE_INFO_ON) return true;
  if (n === WIRE.SENSITIVE_INFO_HASHED) return 'hashed';
  throw new ProtocolError(`${field}: unknown SensitiveInfo ${JSON.stringify(n)}`);
}

/**
 * What an agent whose ring is `ring` (undefined: started without one) says of a config asking
 * `forwards` / `maxBytes` (0: no wish): undefined when nothing differs; the ring is never resized live.
 */
export function recorderSizeMismatch(ring: { forwards: number; maxBytes: number } | undefined, forwards: number, maxBytes: number): string | undefined {
  if (!forwards && !maxBytes) return undefined;
  if (!ring) return forwards ? `recorder.forwards = ${forwards} but this agent started without the flight recorder: set WAVEBUS_RECORD_FORWARDS in its environment and restart it` : undefined;
  const f = forwards && forwards !== ring.forwards ? `recorder.forwards = ${forwards} (the ring has ${ring.forwards})` : '';
  const b = maxBytes && maxBytes !== ring.maxBytes ? `recorder.max_bytes = ${maxBytes} (the ring has ${ring.maxBytes})` : '';
  if (!f && !b) return undefined;
  return `${[f, b].filter(Boolean).join(', ')}: the ring is sized when the agent starts (WAVEBUS_RECORD_FORWARDS / WAVEBUS_RECORD_MAX_BYTES); restart the agents to resize it. Kept as it is.`;
}
