// Which flight recorder flush an armed dump causes (docs/recorder.md "After an incident"): every
// rank that copies the dump and runs the recorder flushes, at the dump's wave w, every whole
// forward of its ring recorded at or before w into recorder/incident-wave<w>[-dp<r>] under its
// snapshot root (else its dump root). The name and the forwards follow from the wave alone, so
// the coordinator writes them into the report and request_info.json when it arms the dump.
import type { WorldLayout } from '../layout';
import { incidentFlushName } from '../paths';

export interface RecorderFlushListing {
  /** Relative to each rank's snapshot root (else its dump root). */
  dir: string;
  forwards_wanted: { up_to_wave: number; newest: number };
  /** The dump's ranks whose agents announced a recorder (Hello.recorder_forwards), and their K. */
  ranks: number[];
  forwards_per_rank: Record<string, number>;
}


/** Each rank's K as its hello said (0 or absent: off); bounded to the layout's ranks. */
export class RecorderRanks {
  private readonly k = new Map<number, number>();
  constructor(private readonly worldSize: number) {}

  hello(rank: number, forwards: number): void {
    if (!Number.isSafeInteger(rank) || rank < 0 || rank >= this.worldSize) return;
    const n = Number.isSafeInteger(forwards) && forwards > 0 && forwards <= 4096 ? forwards : 0;
    if (n) this.k.set(rank, n);
    else this.k.delete(rank);
  }

  /** The listing for a dump of `replica` armed at `wave` copied by `ranks`; undefined when none of them records. */
  listing(wave: number, replica: number, ranks: readonly number[], layout: Pick<WorldLayout, 'dp'>): RecorderFlushListing | undefined {
    const on = ranks.filter((r) => this.k.has(r)).sort((a, b) => a - b);
    if (!on.length) return undefined;
    return {
      dir: `recorder/${incidentFlushName(wave, layout, replica)}`,
      forwards_wanted: { up_to_wave: wave, newest: Math.max(...on.map((r) => this.k.get(r)!)) },
      ranks: on,
      forwards_per_rank: Object.fromEntries(on.map((r) => [String(r), this.k.get(r)!])),
    };
  }
}
