"""The shared-memory layouts (generated from proto/layouts.json by scripts/gen-layouts.js; do not edit).

shm_layout.py checks and serves them; test/layouts.test.ts checks this file is current."""
import json

LAYOUTS = json.loads(r'''
{
  "recorder": {
    "doc": "docs/recorder.md",
    "what": "The flight recorder's ring: created by the agent (src/agent/recorder-ring.ts), mapped by the engine client (src/client/recorder.ts, clients/python/wavebus_client/recorder.py), which copies each forward's inputs into it; the agent writes it out after a crash or on demand. The header at 0; slot i at header.bytes + i * header.stride.",
    "constants": {
      "magic": {
        "value": 1381122647,
        "doc": "header.magic: \"WBRR\" read as a little-endian u32"
      },
      "version": {
        "value": 1,
        "doc": "header.version"
      },
      "flag_too_large": {
        "value": 1,
        "doc": "slot.flags: the inputs did not fit a slot; the entry says what they were, no data follows"
      }
    },
    "structs": {
      "header": {
        "bytes": 2048,
        "fields": {
          "magic": {
            "at": 0,
            "type": "u32"
          },
          "version": {
            "at": 4,
            "type": "u32"
          },
          "slots": {
            "at": 8,
            "type": "u32",
            "doc": "K, the slots (forwards kept)"
          },
          "stride": {
            "at": 16,
            "type": "u64",
            "doc": "bytes from one slot to the next, the slot header included"
          },
          "forwards": {
            "at": 24,
            "type": "u64",
            "doc": "forwards the client has begun recording (the next one's number - 1)"
          },
          "pid": {
            "at": 32,
            "type": "u32",
            "doc": "the pid of the client that writes"
          },
          "note_len": {
            "at": 36,
            "type": "u32",
            "doc": "bytes of the note"
          },
          "note": {
            "at": 64,
            "type": "bytes",
            "bytes": 1984,
            "doc": "an uncaught exception's type and message, UTF-8, at most this many bytes"
          }
        }
      },
      "slot": {
        "bytes": 32,
        "doc": "The slot's header; the RecorderEntry (proto/wavebus.proto) follows at slot.bytes, the inputs' data 8-aligned after it, in input order.",
        "fields": {
          "commit": {
            "at": 0,
            "type": "u64",
            "doc": "0 empty, 2n+1 while forward n (from 0) is written, 2n+2 once it is whole; a reader keeps a slot only if the word is even and the same before and after it read the slot"
          },
          "entry_len": {
            "at": 8,
            "type": "u32",
            "doc": "bytes of the RecorderEntry"
          },
          "flags": {
            "at": 12,
            "type": "u32",
            "doc": "flag_too_large"
          },
          "data_len": {
            "at": 16,
            "type": "u64",
            "doc": "bytes of the inputs' data"
          }
        }
      }
    }
  },
  "telemetry": {
    "doc": "docs/native.md",
    "what": "The telemetry ring of the tensor hot path: one per engine client that asked for it at hello, created by its agent (src/agent/telemetry-ring.ts; 0600, beside the mailbox), written by the client (clients/python/wavebus_client/ring.py: one copy per column, no system call, no message), read by the agent, which polls header.written. The header at 0; slot i at header.bytes + i * header.slot_bytes, slot k's write (k from 1) in slot (k - 1) % slots; a slot is the slot struct followed by the columns (bit i of slot.present: column i holds this step's values).",
    "constants": {
      "magic": {
        "value": 1381253719,
        "doc": "header.magic: \"WBTR\" read as a little-endian u32"
      },
      "magic_hi": {
        "value": 826756681,
        "doc": "header.magic_hi: \"ING1\" read as a little-endian u32"
      },
      "version": {
        "value": 1,
        "doc": "header.version"
      },
      "slots": {
        "value": 8,
        "doc": "slots in a ring the agent creates"
      }
    },
    "structs": {
      "header": {
        "bytes": 64,
        "fields": {
          "magic": {
            "at": 0,
            "type": "u32",
            "doc": "\"WBTR\" read as a little-endian u32 (constant magic)"
          },
          "magic_hi": {
            "at": 4,
            "type": "u32",
            "doc": "\"ING1\" read as a little-endian u32 (constant magic_hi): the file starts with the text WBTRING1"
          },
          "version": {
            "at": 8,
            "type": "u32",
            "doc": "this layout's version"
          },
          "slots": {
            "at": 12,
            "type": "u32",
            "doc": "slots in the ring"
          },
          "max_rows": {
            "at": 16,
            "type": "u32",
            "doc": "rows a slot holds (the client's max_rows at hello)"
          },
          "max_tokens": {
            "at": 20,
            "type": "u32",
            "doc": "sampled tokens a slot holds"
          },
          "max_events": {
            "at": 24,
            "type": "u32",
            "doc": "finish/free events a slot holds"
          },
          "vocab": {
            "at": 28,
            "type": "u32",
            "doc": "token ids must be below it (0: not checked)"
          },
          "slot_bytes": {
            "at": 32,
            "type": "u64",
            "doc": "bytes from one slot to the next"
          },
          "pid": {
            "at": 40,
            "type": "u32",
            "doc": "the writing client's pid"
          },
          "max_extra": {
            "at": 44,
            "type": "u32",
            "doc": "bytes of the extra column a slot holds"
          },
          "written": {
            "at": 48,
            "type": "u64",
            "doc": "seq of the last whole write the agent may take on its own (its slot holds the head's extra)"
          },
          "consumed": {
            "at": 56,
            "type": "u64",
            "doc": "seq of the last slot the agent took (written by the agent): the client writes slot k only once consumed >= 2 (k - slots), else sends that head as a message"
          }
        }
      },
      "slot": {
        "bytes": 64,
        "doc": "A slot's header; the columns follow it.",
        "fields": {
          "seq": {
            "at": 0,
            "type": "u64",
            "doc": "0 empty; odd while written; 2k once write k (k from 1) is whole; slot (k - 1) % slots"
          },
          "wave": {
            "at": 8,
            "type": "u64",
            "doc": "the wave whose head carries this slot"
          },
          "rows": {
            "at": 16,
            "type": "u32",
            "doc": "rows in this step (<= max_rows)"
          },
          "tokens": {
            "at": 20,
            "type": "u32",
            "doc": "entries in the per-token columns (<= max_tokens)"
          },
          "events": {
            "at": 24,
            "type": "u32",
            "doc": "entries in the per-event columns (<= max_events)"
          },
          "present": {
            "at": 28,
            "type": "u32",
            "doc": "bit i: column i of 'columns' holds this step's values"
          },
          "extra_len": {
            "at": 32,
            "type": "u32",
            "doc": "bytes in the extra column"
          }
        }
      }
    },
    "columns": {
      "after": "slot",
      "items": [
        {
          "name": "row",
          "type": "u32",
          "count": "header.max_rows",
          "doc": "the batch row (slot) of each sampled request; always present"
        },
        {
          "name": "token_count",
          "type": "u32",
          "count": "header.max_rows",
          "doc": "tokens each row sampled; absent: one each"
        },
        {
          "name": "token_ids",
          "type": "u32",
          "count": "header.max_tokens",
          "doc": "the sampled token ids, row by row"
        },
        {
          "name": "token_logprobs",
          "type": "f32",
          "count": "header.max_tokens",
          "doc": "their log-probabilities"
        },
        {
          "name": "draft_len",
          "type": "u32",
          "count": "header.max_rows",
          "doc": "speculative tokens proposed"
        },
        {
          "name": "accepted",
          "type": "u32",
          "count": "header.max_rows",
          "doc": "speculative tokens accepted (with the bonus)"
        },
        {
          "name": "event_row",
          "type": "u32",
          "count": "header.max_events",
          "doc": "rows finished or freed since the last head"
        },
        {
          "name": "event_flags",
          "type": "u8",
          "count": "header.max_events",
          "doc": "bit 0 finished, bit 1 freed"
        },
        {
          "name": "extra",
          "type": "u8",
          "count": "header.max_extra",
          "doc": "the head's sparse part: a WaveHeadRequest (wave, telemetry.wave, bindings, block tables, non-finite rows); absent: the head comes as a message naming ring_seq"
        }
      ]
    }
  },
  "decision": {
    "doc": "docs/runtime-guard.md",
    "what": "rank_divergence's decision ring: created by the agent beside the mailbox (0600, src/agent/decision-ring.ts, read with pread), mapped by the engine client (clients/python/wavebus_client/digest.py; src/client/digest.ts writes with pwrite), which writes per wave a digest of the forward's inputs and of the token column it decided, with the column. The header at 0; wave w's slot i = w % header.slots: its slot struct at header.bytes + i * slot.bytes, its token column (i32[header.max_rows], row order) at constant columns + i * 4 * header.max_rows. With the inputs' row starts (flag_input_columns), the forward's inputs too: slot i's input columns at inputs = columns + header.slots * 4 * header.max_rows, then i * 4 * (2 * header.max_input_tokens + header.max_rows + 1): token ids i32[max_input_tokens], positions i32[max_input_tokens], row starts i32[max_rows + 1] (slot.input_rows + 1 of them used); the agent makes a per-row digest of them when the coordinator asks after an inputs mismatch, to name the first row whose inputs differ.",
    "constants": {
      "magic": {
        "value": 1145324119,
        "doc": "header.magic: \"WBDD\" read as a little-endian u32"
      },
      "version": {
        "value": 2,
        "doc": "header.version"
      },
      "slots": {
        "value": 32,
        "doc": "header.slots: the waves a ring keeps"
      },
      "columns": {
        "value": 2048,
        "doc": "the byte offset of slot 0's token column (after the 32 slot structs)"
      },
      "max_rows": {
        "value": 4096,
        "doc": "header.max_rows of a ring the agent creates"
      },
      "flag_tokens": {
        "value": 1,
        "doc": "slot.flags: the token digest is written (the wave is decided)"
      },
      "flag_inputs": {
        "value": 2,
        "doc": "slot.flags: the input digest is written"
      },
      "flag_column": {
        "value": 4,
        "doc": "slot.flags: the column is in the slot (rows <= max_rows)"
      },
      "max_input_tokens": {
        "value": 8192,
        "doc": "header.max_input_tokens of a ring the agent creates: a forward with more input tokens gets its digest only"
      },
      "flag_input_columns": {
        "value": 8,
        "doc": "slot.flags: the forward's token ids, positions and row starts are in the slot's input columns"
      }
    },
    "structs": {
      "header": {
        "bytes": 64,
        "fields": {
          "magic": {
            "at": 0,
            "type": "u32"
          },
          "version": {
            "at": 4,
            "type": "u32"
          },
          "slots": {
            "at": 8,
            "type": "u32",
            "doc": "slots (constant slots)"
          },
          "max_rows": {
            "at": 12,
            "type": "u32",
            "doc": "rows a slot's column holds"
          },
          "max_input_tokens": {
            "at": 16,
            "type": "u32",
            "doc": "input token ids (and positions) a slot's input columns hold"
          }
        }
      },
      "slot": {
        "bytes": 48,
        "fields": {
          "seq": {
            "at": 0,
            "type": "u64",
            "doc": "odd while the client writes the slot; a reader keeps it only if even, non-zero and the same before and after it read"
          },
          "wave": {
            "at": 8,
            "type": "u64"
          },
          "token_crc": {
            "at": 16,
            "type": "u32",
            "doc": "CRC-32 (zlib's) of the token column as int32 little-endian in row order"
          },
          "rows": {
            "at": 20,
            "type": "u32",
            "doc": "rows of the token column"
          },
          "input_crc": {
            "at": 24,
            "type": "u32",
            "doc": "CRC-32 of the forward's inputs (token ids' bytes, then positions')"
          },
          "input_tokens": {
            "at": 28,
            "type": "u32",
            "doc": "token ids in the forward's inputs"
          },
          "flags": {
            "at": 32,
            "type": "u32",
            "doc": "flag_tokens, flag_inputs, flag_column, flag_input_columns"
          },
          "input_rows": {
            "at": 36,
            "type": "u32",
            "doc": "rows of the forward's inputs (row starts written: input_rows + 1)"
          }
        }
      }
    }
  }
}
''')
