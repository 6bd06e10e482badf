"""CRC-32C (Castagnoli), in Python: "crc32c:%08x" checksums of bundle files.

Table-driven. Large inputs are split into equal chunks whose CRCs are computed side by side with
numpy (one table lookup per byte position across all chunks), then joined with the CRC combine
operator (the effect of appending n zero bytes, a GF(2) matrix), so verifying a big bundle does
not take a Python loop per byte.
"""
from typing import List, Optional

_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _make_table() -> List[int]:
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t.append(c)
    return t


TABLE = _make_table()
_np_table = None
_CHUNKS = 4096
_SMALL = 1 << 16


def _crc_loop(data, crc: int) -> int:
    c = crc ^ 0xFFFFFFFF
    t = TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _gf2_times(mat: List[int], vec: int) -> int:
    s = 0
    i = 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _gf2_square(mat: List[int]) -> List[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def _zeros_operator(nbytes: int) -> List[int]:
    """Matrix that advances a CRC register over ``nbytes`` zero bytes (zlib's crc32_combine)."""
    odd = [_POLY] + [1 << (n - 1) for n in range(1, 32)]  # one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four zero bits
    result = None
    n = nbytes
    while n:
        even = _gf2_square(odd)  # first pass: one zero byte
        if n & 1:
            result = even if result is None else [_gf2_times(even, result[k]) for k in range(32)]
        n >>= 1
        if not n:
            break
        odd = _gf2_square(even)
        if n & 1:
            result = odd if result is None else [_gf2_times(odd, result[k]) for k in range(32)]
        n >>= 1
    return result if result is not None else [1 << k for k in range(32)]


def crc32c_combine(crc1: int, crc2: int, len2: int, op: Optional[List[int]] = None) -> int:
    """CRC of A+B from crc(A), crc(B) and len(B)."""
    if len2 == 0:
        return crc1
    return _gf2_times(op or _zeros_operator(len2), crc1) ^ crc2


def _crc_chunks(buf, chunk: int, count: int):
    """Finalised CRC-32C of ``count`` consecutive ``chunk``-byte pieces of buf, side by side."""
    import numpy as np

    global _np_table
    if _np_table is None:
        _np_table = np.array(TABLE, dtype=np.uint32)
    a = np.frombuffer(buf, dtype=np.uint8, count=chunk * count).reshape(count, chunk)
    c = np.full(count, 0xFFFFFFFF, dtype=np.uint32)
    tab = _np_table
    for j in range(chunk):
        c = tab[(c ^ a[:, j]) & 0xFF] ^ (c >> 8)
    return (c ^ 0xFFFFFFFF).tolist()


def crc32c(data, prev: int = 0) -> int:
    """CRC-32C of bytes-like ``data``, continuing from ``prev``: crc32c(b, crc32c(a)) == crc32c(a + b)."""
    mv = memoryview(data).cast("B")
    n = len(mv)
    if n < _SMALL:
        return _crc_loop(mv, prev)
    chunk = n // _CHUNKS
    crcs = _crc_chunks(mv, chunk, _CHUNKS)
    op = _zeros_operator(chunk)
    crc = prev
    for c in crcs:
        crc = crc32c_combine(crc, c, chunk, op)
    return _crc_loop(mv[chunk * _CHUNKS:], crc)


def crc32c_file(path: str, block: int = 64 << 20) -> int:
    crc = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(block)
            if not b:
                return crc
            crc = crc32c(b, crc)


def format_checksum(crc: int) -> str:
    return f"crc32c:{crc:08x}"
