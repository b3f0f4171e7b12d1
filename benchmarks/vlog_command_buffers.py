"""Summarize XLA's command-buffer log of a probe run: per variant, how often and how long the loop body's CUDA
graph was updated (`Updated command buffer in X us; num_commands=N`) and the `needs_update` flags; every timed
log message; and the while loops: how often a condition was evaluated on the host (each a read-back the host
waits for) and how each loop was set up (trip count, body as a graph or not).

The log comes from a run with TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3,while_thunk=3 (add
command_buffer_cmd_executor=3 for the commands each update skipped), e.g.
  TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3,while_thunk=3 PYTHONPATH=. python \
      benchmarks/step_ablation_probe.py --out $OUT --prefixes 32768 --steps 8 --reps 1 --variants bf16,hyquant \
      > $OUT/vlog.txt 2>&1
  python benchmarks/vlog_command_buffers.py $OUT/vlog.txt   (plain or .gz)
The probe prints one result line per variant after its runs; log lines before it are that variant's.
"""
import gzip, re, sys, statistics, collections
path = sys.argv[1]
op = gzip.open if path.endswith(".gz") else open
seg = collections.defaultdict(list); cur = "start"; flags = collections.Counter()
for line in op(path, "rt", errors="replace"):
    m = re.search(r"Updated command buffer in (\d+) .s; num_commands=(\d+)", line)
    if m:
        seg[cur].append((int(m.group(2)), int(m.group(1))))
    m2 = re.search(r"needs_update=(\w+)", line)
    if m2:
        flags[(cur, m2.group(1))] += 1
    m3 = re.match(r"\s+(\d+)\s+(\S+)\s+([\d.]+) ms", line)
    if m3:
        print("result", m3.group(2), m3.group(3), "ms")
        seg[m3.group(2) + " (done)"] = seg.pop(cur, []); cur = "after " + m3.group(2)
for k, v in seg.items():
    big = collections.defaultdict(list)
    for n, us in v:
        big[n].append(us)
    for n, uss in sorted(big.items()):
        if len(uss) > 2:
            print(k, "num_commands", n, "updates", len(uss), "median us", statistics.median(uss), "max", max(uss))
print(dict(flags))
def log_lines_by_variant():
    """(segment, line) for every log line that is not a probe result line; the lines after variant X's result
    are in segment "after X" (those of the variant that ran next), the first ones in "start"."""
    cur = "start"
    for line in op(path, "rt", errors="replace"):
        m3 = re.match(r"\s+(\d+)\s+(\S+)\s+([\d.]+) ms", line)
        if m3:
            cur = "after " + m3.group(2)
        else:
            yield cur, line


# every timed log message ("... in N us ..."), per variant: count and total; and the host-driven loops: per
# variant, how often a while loop's condition was evaluated on the host (one read-back and host wait each) and
# how each while loop was set up (trip count, whether its body runs as a graph); and the updates'
# changed-allocation counts ("Update command buffer ... updated_allocs=N", logged before each re-record) and the
# commands a re-record skipped because none of their buffers moved ("Skip updating command", where this XLA
# logs it)
timed = collections.defaultdict(lambda: [0, 0])
loops = collections.Counter()
changed, skipped = collections.defaultdict(list), collections.Counter()
for cur, line in log_lines_by_variant():
    m = re.search(r"\] (.*?) in (\d+) .s(.*)", line)
    if m:
        key = (cur, re.sub(r"\d+", "#", m.group(1) + m.group(3))[:120])
        timed[key][0] += 1
        timed[key][1] += int(m.group(2))
    for pattern in (r"Executing WhileThunk condition computation", r"WhileThunk::Initialize command buffer: .*",
                    r"Executing WhileThunk for \d+ iterations", r"[A-Za-z]*While[A-Za-z]*Cmd[^;]*"):
        m = re.search(pattern, line)
        if m:
            loops[(cur, re.sub(r"\d+", "#", m.group(0))[:150])] += 1
    m = re.search(r"Update command buffer on device.*num_commands=(\d+); updated_allocs=(\d+)", line)
    if m:
        changed[cur].append((int(m.group(1)), int(m.group(2))))
    if "Skip updating command" in line:
        skipped[cur] += 1
for variant, rows in changed.items():
    big = [r for r in rows if r[0] > 2]
    print(f"{variant:>22} updates={len(rows)} (of graphs with >2 commands: {len(big)}), updated_allocs "
          f"median={statistics.median(a for _, a in rows)} max={max(a for _, a in rows)}; "
          f"skipped commands={skipped[variant]}")
for (variant, msg), (n, total) in sorted(timed.items(), key=lambda kv: -kv[1][1])[:40]:
    print(f"{variant:>22} n={n:>5} total_us={total:>9} {msg}")
for (variant, msg), n in sorted(loops.items()):
    print(f"{variant:>22} n={n:>6} {msg}")
