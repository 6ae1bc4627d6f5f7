#!/usr/bin/env bash
# make bench: runs Berth's benchmarks in one go and prints their figures as one table, with the
# ratios the issues ask for computed from the same run. Sizes: BERTH_BENCH_FILES (large-repo
# worktree, default 20000), BERTH_BENCH_TREE_* (see workspace/BENCH.md).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT

run() { # package, pattern, benchtime
  echo "== go test -run '^\$' -bench '$2' -benchtime $3 $1" >&2
  go test -run '^$' -bench "$2" -benchtime "$3" -count=1 "$1" | tee -a "$out" >&2
}
run ./handlers/ 'BenchmarkLogin$|BenchmarkMeToken$' 2s
run ./handlers/ 'BenchmarkTaskListPage|BenchmarkPlanAPI|BenchmarkTaskPage' 1000x
# The command palette's search over 10,000 tasks (docs/pages.md "Search").
run ./handlers/ 'BenchmarkPaletteSearch' 300x
run ./handlers/ 'BenchmarkAdmissionToStartShared' 50x
run ./handlers/ 'BenchmarkAdmissionToStartWorktree' 5x
run ./handlers/ 'BenchmarkAdmissionToStartContainment|BenchmarkAdmissionToStartSandbox' 50x
run ./environment/ 'BenchmarkJailStart$' 300x
# Hostile output and network (docs/security.md, docs/network.md): a jail in its workspace's own
# network namespace vs the host's network, finalize's git add/commit in the jail vs on the host,
# and the egress proxy vs direct connections from the same process.
run ./environment/ 'BenchmarkJailStartNetns' 200x
run ./workspace/ 'BenchmarkFinalizeCommit' 40x
run ./environment/egress/ 'BenchmarkEgress' 20x
run ./environment/ 'BenchmarkServiceStartToHealthy' 30x
run ./handlers/ 'BenchmarkPreviewProxy$|BenchmarkPreviewWebSocket$' 1x
run ./jobs/ 'BenchmarkRiverPickup' 500x
run ./handlers/ 'BenchmarkSSEFanout' 200x
run ./jobs/spool/ 'BenchmarkSpoolSave' 50x
run ./db/ 'BenchmarkLeaseVsRawSkipLocked' 4s
# Backups (docs/operations.md "Figures"): 1,000 runs, 50 MiB of artifacts, a 20 MiB layer; full, then incremental.
run ./db/backup/ 'BenchmarkBackup1000Runs' 3x
# Scale-out (docs/scaling.md "Figures"): runs/s end to end with 1 and 2 worker nodes on one database.
run ./cmd/berth/ 'BenchmarkNodesRunsPerSecond' 1x
# Idle cost (issue 21): a server with one finished run and an open SSE stream, idle for
# BERTH_IDLE_SECONDS (60): database queries/s and CPU % of one core.
run ./cmd/berth/ 'BenchmarkIdleServer' 1x
# Copy realization vs cp -a, interleaved, on a 5,000-file / 100 MB tree (before the 1x smoke run,
# so the summary's ratio is this one).
BERTH_BENCH_FILES=5000 BERTH_BENCH_MB=100 run ./workspace/ 'BenchmarkCopyVsCp' 7x
# Receipts and attempts (docs/attempts.md "Figures"): the tree digest of a 20,000-file workspace vs a
# reference Go tree hash, and 4 attempts in parallel vs 4 sequential runs.
run ./workspace/ 'BenchmarkReceiptTreeDigest' 3x
run ./handlers/ 'BenchmarkAttemptsParallel' 1x
run ./workspace/ '.' 1x
# The terminal bridge against WeTTY and a raw pty (docs/terminal.md "Benchmarks"). WeTTY is
# installed into a cache dir outside the repo; when it cannot be, the reason is printed above.
BERTH_BENCH_WETTY=$(./scripts/bench-wetty.sh) || { echo "bench: WeTTY not measured" >&2; BERTH_BENCH_WETTY=; }
export BERTH_BENCH_WETTY
run ./terminal/ 'BenchmarkTerminalThroughput' 3x
run ./terminal/ 'BenchmarkTerminalEcho' 2000x
run ./terminal/ 'BenchmarkTerminalIdleMemory' 1x
# Environment plugins and OCI images (docs/plugins.md "Figures"): plugin exec of true vs the in-tree
# driver, podman admission -> start vs bare podman run, a 200 MB OCI import vs crane export
# (crane v0.22.1 is installed into BERTH_BENCH_CRANE, default /var/tmp/berth-crane, on first use).
run ./environment/ 'BenchmarkPluginExec' 200x
run ./cmd/berth-driver-podman/ 'BenchmarkPodmanAdmissionToStart' 10x
run ./environment/oci/ 'BenchmarkImportVsCraneExport' 3x
# Berth for agents (docs/mcp.md "Figures"): file_read of a 64 KiB file through MCP vs the REST file
# API, and a tool call's overhead over the API call it makes (task_get vs GET /api/tasks/{id}).
run ./handlers/ 'BenchmarkMCPFileRead|BenchmarkMCPToolCall' 300x
# The SDK's own floor under that read: a 64 KiB text tool result vs a plain JSON handler, no Berth.
run ./handlers/mcp/ 'BenchmarkMCPTextResult' 500x

echo
printf '%-58s %16s  %s\n' "benchmark" "value" "unit"
printf '%-58s %16s  %s\n' "---------" "-----" "----"
# Every "value unit" pair after ns/op on a benchmark line.
awk '/^Benchmark/ { name=$1; sub(/-[0-9]+$/, "", name);
       for (i = 3; i + 1 <= NF; i += 2) printf "%-58s %16s  %s\n", name, $i, $(i+1) }' "$out"

metric() { awk -v b="$1" -v u="$2" '$1 ~ "^"b"(-[0-9]+)?$" { for (i = 3; i + 1 <= NF; i += 2) if ($(i+1) == u) print $i }' "$out" | head -1; }
echo
for w in workspaces hot; do
  r=$(metric "BenchmarkLeaseVsRawSkipLocked/$w" ratio)
  [ -n "$r" ] && echo "lease acquire+release vs raw SKIP LOCKED, $w workload: ${r}x (goal >= 0.6x for workspaces)"
done
for w in tmpfs disk; do
  ratio=$(metric "BenchmarkAdmissionToStartWorktree/$w" ratio-p50); over=$(metric "BenchmarkAdmissionToStartWorktree/$w" overhead-p50-ms)
  [ -n "$ratio" ] && echo "large-repo worktree admission-to-start vs bare git worktree add, $w: ${ratio}x, overhead ${over} ms (goal <= 1.3x + 100 ms)"
done
cr=$(metric BenchmarkCopyVsCp ratio)
[ -n "$cr" ] && echo "copy realization vs cp -a (5,000 files, 100 MB), medians: ${cr}x (goal >= 0.9x; above 1 is faster)"
rt=$(metric BenchmarkReceiptTreeDigest ratio)
[ -n "$rt" ] && echo "receipt tree digest of a $(metric BenchmarkReceiptTreeDigest files)-file workspace vs a reference Go tree hash (walk + sha256, sorted), medians: ${rt}x for a copy workspace, $(metric BenchmarkReceiptTreeDigest ratio-worktree)x for a git worktree (goal >= 0.7x; above 1 is faster)"
for c in sleep cpu; do
  ar=$(metric "BenchmarkAttemptsParallel/$c" ratio)
  [ -n "$ar" ] && echo "4 attempts in parallel vs 4 sequential runs, $c command: $(metric "BenchmarkAttemptsParallel/$c" parallel-s) s vs $(metric "BenchmarkAttemptsParallel/$c" sequential-s) s, ${ar}x (bounded by Berth's per-run work for sleep, by the 2 cores for cpu)"
done
for wl in cpu sleep; do
  b=BenchmarkNodesRunsPerSecond/$wl nr=$(metric "BenchmarkNodesRunsPerSecond/$wl" ratio)
  case $wl in
    cpu) what="true, 20 workers a node; every process shares 2 cores here, docs/scaling.md" ;;
    sleep) what="sleep 0.5, 4 workers a node; goal >= 1.8x" ;;
  esac
  if [ -n "$nr" ]; then echo "runs/s end to end (admission -> finalize settled, $what): $(metric "$b" runs/s-1node) with 1 worker node, $(metric "$b" runs/s-2nodes) with 2 on one database, ${nr}x"; fi
done
shared=$(metric BenchmarkAdmissionToStartShared p50-ms)
[ -n "$shared" ] && echo "shared workspace admission-to-start p50: ${shared} ms (goal <= 50 ms)"
added=$(metric BenchmarkAdmissionToStartContainment added-p50-ms); jailed=$(metric BenchmarkAdmissionToStartContainment jail-p50-ms)
[ -n "$added" ] && echo "local shared admission-to-start, jailed p50: ${jailed} ms, the jail adds ${added} ms p50 over containment none (goal <= 10 ms added, <= 25 ms jailed)"
sb=$(metric BenchmarkAdmissionToStartSandbox p50-ms)
[ -n "$sb" ] && echo "sandbox isolated worktree (small repo) admission-to-start p50: ${sb} ms (goal <= 50 ms)"
mf=$(metric BenchmarkMCPFileRead ratio-p50)
[ -n "$mf" ] && echo "MCP file_read of 64 KiB vs the REST file API, p50: ${mf}x ($(metric BenchmarkMCPFileRead mcp-p50-ms) vs $(metric BenchmarkMCPFileRead rest-p50-ms) ms; goal <= 1.5x)"
mt=$(metric BenchmarkMCPTextResult flat-p50-ms)
[ -n "$mt" ] && echo "the SDK alone, a 64 KiB text tool result, p50: ${mt} ms vs $(metric BenchmarkMCPTextResult json-p50-ms) ms for plain JSON ($(metric BenchmarkMCPTextResult sdk-p50-ms) ms with the SDK's own result encoding)"
mo=$(metric BenchmarkMCPToolCall overhead-p50-ms)
[ -n "$mo" ] && echo "MCP tool-call overhead over its API call, p50: ${mo} ms (goal <= 2 ms)"
jr=$(metric BenchmarkJailStart ratio-p50)
[ -n "$jr" ] && echo "Berth's jailed exec of true vs bare bwrap true, p50: ${jr}x (goal <= 1.5x)"
pr=$(metric BenchmarkPreviewProxy ratio); pa=$(metric BenchmarkPreviewProxy added-p50-ms)
pn=$(metric BenchmarkPreviewProxy ratio-nginx); pna=$(metric BenchmarkPreviewProxy nginx-added-p50-ms)
ppl=$(metric BenchmarkPreviewProxy ratio-plain)
[ -n "$pr" ] && echo "preview listener vs direct, 20 KB page at 32 clients: ${pr}x requests/s (goal >= 0.5x); vs nginx proxy_pass keep-alive: ${pn:-not measured (no nginx)}x (goal >= 0.9x); vs a plain httputil reverse proxy: ${ppl}x; added p50 ${pa} ms (goal <= 0.5 ms; nginx adds ${pna:-?} ms)"
wr=$(metric BenchmarkPreviewWebSocket ratio)
[ -n "$wr" ] && echo "WebSocket echo RTT through the proxy vs direct, p50: ${wr}x (goal <= 2x)"
so=$(metric BenchmarkServiceStartToHealthy own-startup-p50-ms); sh=$(metric BenchmarkServiceStartToHealthy start-to-healthy-p50-ms)
[ -n "$sh" ] && echo "Go HTTP server as a service, start -> healthy p50: ${sh} ms vs its own startup ${so} ms (goal <= startup + 20 ms)"
pickup=$(metric BenchmarkRiverPickup p50-ms)
[ -n "$pickup" ] && echo "River pickup p50: ${pickup} ms"
ssep=$(metric BenchmarkSSEFanout p99-ms)
[ -n "$ssep" ] && echo "run status change committed -> SSE event at $(metric BenchmarkSSEFanout clients) connected streams: p50 $(metric BenchmarkSSEFanout p50-ms) ms, p99 ${ssep} ms (goal p99 <= 100 ms); idle: $(metric BenchmarkSSEFanout idle-req/s) requests/s, $(metric BenchmarkSSEFanout idle-bytes/s) bytes/s over 5 s (goal 0 requests/s)"
tpp=$(metric BenchmarkTaskPage p50-ms)
[ -n "$tpp" ] && echo "task page server time p50: ${tpp} ms, with live pages (SSE subscription) $(metric BenchmarkTaskPageLive p50-ms) ms (goal <= 2 ms)"
ps=$(metric BenchmarkPaletteSearch/title-word p50-ms)
[ -n "$ps" ] && echo "palette search over 10,000 tasks p50: ${ps} ms for a title word, $(metric BenchmarkPaletteSearch/key p50-ms) ms for a task key, $(metric BenchmarkPaletteSearch/no-match p50-ms) ms for no match (goal <= 20 ms)"
sp1=$(metric BenchmarkSpoolSave/log=1KiB ms/save); sp2=$(metric BenchmarkSpoolSave/log=1024KiB ms/save)
[ -n "$sp1" ] && echo "run outcome spool save (fsynced) per run end: ${sp1} ms (1 KiB log), ${sp2} ms (1 MiB log)"
tm() { metric "BenchmarkTerminal$1" "$2"; }
tr=$(tm Throughput ratio-raw); tw=$(tm Throughput ratio-wetty)
[ -n "$tr" ] && echo "terminal cat 64 MiB: Berth $(tm Throughput berth-MBps) MB/s, raw pty $(tm Throughput raw-MBps), WeTTY $(tm Throughput wetty-MBps): ${tr}x raw, ${tw:-n/a}x WeTTY (goal >= 0.9x raw, >= 1.0x WeTTY); jailed shell $(tm Throughput jailed-MBps) MB/s; Berth skipped $(tm Throughput lost-MiB) MiB per run"
er=$(tm Echo ratio-p50-raw)
[ -n "$er" ] && echo "terminal keystroke echo: Berth p50 $(tm Echo berth-p50-ms) ms = ${er}x raw pty ($(tm Echo raw-p50-ms) ms), p99 $(tm Echo berth-p99-ms) ms; jailed p50/p99 $(tm Echo jailed-p50-ms)/$(tm Echo jailed-p99-ms) ms; WeTTY $(tm Echo wetty-p50-ms)/$(tm Echo wetty-p99-ms) ms (goal p50 <= 3x raw, p99 <= 2 ms)"
mb=$(tm IdleMemory beyond-scrollback-MiB)
[ -n "$mb" ] && echo "terminal idle session: Berth $(tm IdleMemory berth-heap-MiB/session) MiB heap (${mb} MiB beyond its scrollback), $(tm IdleMemory berth-rss-MiB/session) MiB RSS; WeTTY $(tm IdleMemory wetty-rss-MiB/session) MiB RSS (goal <= 2 MiB beyond the scrollback)"
po=$(metric BenchmarkPluginExec overhead-p50-ms)
[ -n "$po" ] && echo "plugin exec of true p50: $(metric BenchmarkPluginExec plugin-p50-ms) ms vs the in-tree local driver $(metric BenchmarkPluginExec intree-p50-ms) ms: ${po} ms overhead (goal <= 2 ms); vs a bare fork/exec of sh -c true: $(metric BenchmarkPluginExec protocol-p50-ms) ms; jailed local $(metric BenchmarkPluginExec intree-jailed-p50-ms) ms"
pa=$(metric BenchmarkPodmanAdmissionToStart ratio-p50)
[ -n "$pa" ] && echo "podman lease admission -> command start p50: $(metric BenchmarkPodmanAdmissionToStart berth-p50-ms) ms vs bare podman run --rm true $(metric BenchmarkPodmanAdmissionToStart bare-run-p50-ms) ms: ${pa}x"
oi=$(metric BenchmarkImportVsCraneExport ratio)
[ -n "$oi" ] && echo "OCI import of a $(metric BenchmarkImportVsCraneExport image-MiB) MiB image: Berth $(metric BenchmarkImportVsCraneExport berth-ms) ms vs crane export $(metric BenchmarkImportVsCraneExport crane-export-ms) ms (${oi}x), vs crane export | tar -x $(metric BenchmarkImportVsCraneExport crane-export-untar-ms) ms ($(metric BenchmarkImportVsCraneExport ratio-untar)x; above 1 is faster)"
exit 0
nn=$(metric BenchmarkJailStartNetns added-new-p50-ms)
[ -n "$nn" ] && echo "jail start in a workspace's own network namespace: +${nn} ms p50 for a new workspace, +$(metric BenchmarkJailStartNetns added-held-p50-ms) ms beside its service, over the host's network ($(metric BenchmarkJailStartNetns host-net-p50-ms) ms) (goal <= +2 ms)"
fr=$(metric BenchmarkFinalizeCommit ratio-p50)
[ -n "$fr" ] && echo "finalize commit with git add/commit in the jail vs on the host, p50: $(metric BenchmarkFinalizeCommit jailed-p50-ms) ms vs $(metric BenchmarkFinalizeCommit host-p50-ms) ms, ${fr}x (goal <= 1.2x)"
ec=$(metric BenchmarkEgressConnectSetup added-p50-ms)
[ -n "$ec" ] && echo "egress CONNECT setup added p50: ${ec} ms (goal <= 1 ms); injected HTTPS request added p50: $(metric BenchmarkEgressInjected added-p50-ms) ms (goal <= 2 ms)"
ed=$(metric BenchmarkEgressDownload ratio)
[ -n "$ed" ] && echo "200 MB HTTPS download through the egress proxy vs direct: ${ed}x (goal >= 0.9x); 1,000 concurrent tunnels: $(metric BenchmarkEgressConcurrentTunnels failed) failed"
