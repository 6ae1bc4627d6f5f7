package workspace

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// BenchmarkFinalizeCommit prices moving finalize's `git add -A` and `git commit` into the jail
// (DESIGN §14, issue 20): the same Commit of a one-file change in a worktree of a 200-file
// repository by a Manager with the jail (the run user's view, objects brought home through
// index-pack and a compare-and-swap ref update) and by one without (the same script on the host,
// as finalize ran before), alternating. It reports both p50s and their ratio (goal ≤ 1.2×).
func BenchmarkFinalizeCommit(b *testing.B) {
	if testJail() == nil {
		b.Skip("no bubblewrap: nothing to compare")
	}
	files := map[string]string{}
	for i := range 200 {
		files[fmt.Sprintf("src/f%03d.go", i)] = fmt.Sprintf("package src\n\nconst F%d = %d\n", i, i)
	}
	ctx := context.Background()
	type side struct {
		m   *Manager
		res Result
		d   []time.Duration
	}
	mk := func(name string, opts Options) *side {
		m, err := NewManager(b.TempDir(), opts)
		if err != nil {
			b.Fatal(err)
		}
		repo := newRepo(b, files)
		res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "BEN-" + name})
		if err != nil {
			b.Fatal(err)
		}
		return &side{m: m, res: res}
	}
	jailed, host := mk("1", Options{Jail: testJail()}), mk("2", Options{})
	commit := func(s *side, i int) {
		writeFiles(b, filepath.Join(s.m.Base(), s.res.Cwd), map[string]string{"src/f007.go": fmt.Sprintf("package src\n\nconst F7 = %d\n", i)})
		start := time.Now()
		c, err := s.m.Commit(ctx, s.res.Ref, CommitSpec{Branch: s.res.Branch, TaskKey: "BEN-1", RunID: fmt.Sprint("run-", i)})
		if err != nil || !c.Changed {
			b.Fatalf("commit: %+v %v", c, err)
		}
		s.d = append(s.d, time.Since(start))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		commit(jailed, i)
		commit(host, i)
	}
	b.StopTimer()
	p50 := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	j, h := p50(jailed.d), p50(host.d)
	b.ReportMetric(float64(j.Microseconds())/1000, "jailed-p50-ms")
	b.ReportMetric(float64(h.Microseconds())/1000, "host-p50-ms")
	b.ReportMetric(float64(j)/float64(h), "ratio-p50")
}
