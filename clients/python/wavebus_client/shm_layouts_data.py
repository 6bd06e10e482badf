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
  }
}
''')
