"""`python3 -m wavebus_client --version`: the client's version and the protocol it speaks."""
import argparse
import sys

from .version import __version__, protocol_version


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m wavebus_client", description="wavebus engine client (see docs/python-client.md)")
    ap.add_argument("--version", action="store_true", help="print the client version and the protocol version")
    args = ap.parse_args(argv)
    if not args.version:
        ap.print_help()
        return 0
    print(f"wavebus_client {__version__} (client protocol {protocol_version()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
