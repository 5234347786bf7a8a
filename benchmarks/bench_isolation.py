"""What read-only file protection adds to a forked child, per mode.

Each run forks a child that calls ``protect()`` (or nothing, for the baseline), reports
through a pipe and exits; the parent waits for it. "added" is the median end-to-end time
minus the baseline's median (fork + exit + wait, the namespace teardown included);
"in child" is the median of ``protect()`` alone, timed inside the child.

    python benchmarks/bench_isolation.py [runs]
"""

from __future__ import annotations

import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from coordex.backends import isolation


def one_run(allow: isolation.FilesMode | None, work: list[str]) -> tuple[float, float, str]:
    scratch = tempfile.mkdtemp(prefix="coordex-bench-")
    read_end, write_end = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            began = time.perf_counter()
            mode = "baseline" if allow is None else isolation.protect(work, scratch, allow=allow)
            spent = time.perf_counter() - began
            os.write(write_end, struct.pack("d", spent) + mode.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = os.read(read_end, 64)
    os.close(read_end)
    os.waitpid(pid, 0)
    total = time.perf_counter() - start
    shutil.rmtree(scratch, ignore_errors=True)
    (inside,) = struct.unpack("d", data[:8])
    return total, inside, data[8:].decode()


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    base = Path(tempfile.mkdtemp(prefix="coordex-bench-tree-"))
    try:
        work = []
        for name in ("home", "project"):
            folder = base / name
            (folder / "src").mkdir(parents=True)
            for i in range(50):
                (folder / "src" / f"f{i}.py").write_text("x = 1\n")
            work.append(str(folder))

        began = time.perf_counter()
        caps = isolation.probe()
        first_probe = time.perf_counter() - began
        began = time.perf_counter()
        isolation.probe()
        cached_probe = time.perf_counter() - began
        print(f"probe(): {caps}; first call {first_probe * 1e3:.2f} ms, "
              f"cached {cached_probe * 1e6:.1f} us")
        print(f"{runs} runs per row, 2 work folders; median milliseconds\n")

        rows: list[tuple[str, isolation.FilesMode | None]] = [
            ("fork only", None), ("none", "none"), ("refused", "refused"),
            ("discarded", "discarded")]
        baseline = 0.0
        print(f"{'asked':<10} {'got':<10} {'per fork':>9} {'added':>8} {'in child':>9}")
        for label, allow in rows:
            for _ in range(5):  # warm up: page cache, lazy imports in the child
                one_run(allow, work)
            samples = [one_run(allow, work) for _ in range(runs)]
            total = statistics.median(s[0] for s in samples)
            inside = statistics.median(s[1] for s in samples)
            got = {s[2] for s in samples}
            if allow is None:
                baseline = total
            print(f"{label:<10} {','.join(sorted(got)):<10} {total * 1e3:9.3f} "
                  f"{(total - baseline) * 1e3:8.3f} {inside * 1e3:9.3f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
