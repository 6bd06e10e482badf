// The modes wavebus creates its artifacts with (KV dumps, input snapshots, incident reports,
// request_info / manifest / dump_skipped JSON): `--artifact-mode` on the agent and the
// coordinator (`wavebus launch` passes it to both). See docs/security.md for the table.
//
// Default 0640 for files, 0750 for directories: the owner and the owner's group (a team sharing a
// host) may read them, other users get nothing; dumps hold KV caches (derived from prompts). The
// umask is respected too: modes are given to open(2)/mkdir(2) at creation, so the umask can only
// take bits away. Reports holding sensitive info (token ids) are always created 0600, whatever
// the flag says. World-writable modes are refused: anyone could then replace a finished artifact.
import { ConfigError } from '../errors';

export interface ArtifactModes {
  /** Mode new files are created with (before the umask). */
  file: number;
  /** Mode new directories are created with (before the umask): the file mode plus x wherever r is set. */
  dir: number;
}

export const DEFAULT_FILE_MODE = 0o640;
/** Reports with token ids (report.save_sensitive_info): owner only, whatever --artifact-mode says. */
export const SENSITIVE_FILE_MODE = 0o600;

/** The directory mode that goes with a file mode: x added wherever r is set (0640 → 0750). */
export function dirModeFor(fileMode: number): number {
  return fileMode | ((fileMode & 0o444) >> 2);
}

export const DEFAULT_ARTIFACT_MODES: ArtifactModes = Object.freeze({ file: DEFAULT_FILE_MODE, dir: dirModeFor(DEFAULT_FILE_MODE) });

/** The modes for an artifact holding sensitive info: the file owner-only, directories unchanged. */
export function sensitiveModes(m: ArtifactModes): ArtifactModes {
  return { file: m.file & SENSITIVE_FILE_MODE, dir: m.dir };
}

const octal = (n: number) => `0${n.toString(8).padStart(3, '0')}`;

/** Parse `--artifact-mode` (octal, e.g. 0640); undefined or '' gives the default. Throws ConfigError naming `flag`. */
export function parseArtifactMode(raw: unknown, flag = '--artifact-mode'): ArtifactModes {
  if (raw === undefined || raw === '') return DEFAULT_ARTIFACT_MODES;
  const s = String(raw).trim();
  if (!/^0?[0-7]{3}$/.test(s)) {
    throw new ConfigError(`${flag}: expected an octal file mode such as 0640 (three octal digits; no setuid, setgid or sticky bits), got ${JSON.stringify(raw)}`);
  }
  const file = parseInt(s, 8);
  if (file & 0o002) throw new ConfigError(`${flag}: ${octal(file)} is world-writable; any local user could replace an artifact (use e.g. 0640)`);
  if ((file & 0o600) !== 0o600) throw new ConfigError(`${flag}: ${octal(file)} must let the owner read and write (0600 at least)`);
  if (file & 0o111) throw new ConfigError(`${flag}: ${octal(file)} sets execute bits; artifacts are data (directories get x wherever r is set)`);
  return { file, dir: dirModeFor(file) };
}

/** The yargs option, shared by `wavebus agent`, `wavebus coordinator` and `wavebus launch`. */
export const artifactModeOption = {
  type: 'string' as const,
  describe: 'octal mode for the files wavebus writes (dumps, snapshots, reports); directories get x wherever r is set; the umask applies too; reports with token ids are always 0600',
  defaultDescription: octal(DEFAULT_FILE_MODE),
};
