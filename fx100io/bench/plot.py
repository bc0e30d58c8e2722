"""--plot FILE.png: latency histogram and bandwidth over time.

matplotlib is an optional extra (pip install fx100io[plot]); asking for a
plot without it fails before the run, not after a long benchmark.
"""

from __future__ import annotations

from .errors import BenchError
from .results import JobResult


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchError(
            "--plot needs matplotlib: pip install 'fx100io[plot]' (or pip install matplotlib)"
        ) from None


def plot(results: list[JobResult], path: str) -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # no display needed; we only write a file
    import matplotlib.pyplot as plt

    fig, (ax_lat, ax_bw) = plt.subplots(2, 1, figsize=(10, 8))
    for r in results:
        for which in ("read", "write"):
            d = getattr(r, which)
            if d.n:
                values, counts = d.histogram()
                ax_lat.step(values / 1000.0, 100.0 * counts / d.n, where="mid", label=f"{r.name} {which}")
        if r.kv_load is not None and r.kv_load.n:
            values, counts = r.kv_load.histogram()
            ax_lat.step(
                values / 1000.0, 100.0 * counts / r.kv_load.n, where="mid", label=f"{r.name} prefix load"
            )
        for i, s in enumerate(r.series):
            suffix = f".{i}" if len(r.series) > 1 else ""
            for which, cum in (("read", s.rbytes), ("write", s.wbytes)):
                if len(cum) < 2 or cum[-1] == 0:
                    continue
                t = [x / 1e9 for x in s.t_ns[1:]]
                mib_s = [
                    (b1 - b0) / (1 << 20) / max((t1 - t0) / 1e9, 1e-9)
                    for b0, b1, t0, t1 in zip(cum, cum[1:], s.t_ns, s.t_ns[1:])
                ]
                ax_bw.plot(t, mib_s, label=f"{r.name}{suffix} {which}")
    ax_lat.set_xscale("log")
    ax_lat.set_xlabel("completion latency (us)")
    ax_lat.set_ylabel("% of I/Os")
    ax_lat.set_title("Latency histogram")
    ax_lat.grid(True, which="both", alpha=0.3)
    ax_bw.set_xlabel("time (s)")
    ax_bw.set_ylabel("MiB/s")
    ax_bw.set_title("Bandwidth over time (100 ms samples)")
    ax_bw.grid(True, alpha=0.3)
    for ax in (ax_lat, ax_bw):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise BenchError(f"--plot: cannot write {path}: {e.strerror}") from None
    finally:
        plt.close(fig)
