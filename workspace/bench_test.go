package workspace

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// benchSize reads the benchmark tree size from BERTH_BENCH_FILES and BERTH_BENCH_MB (defaults: 200
// files, 4 MB, small enough for `-benchtime=1x` to finish quickly; the full figure is 20000 and 300).
func benchSize() (files int, totalBytes int64) {
	files, totalBytes = 200, 4<<20
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_FILES")); err == nil && v > 0 {
		files = v
	}
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_MB")); err == nil && v > 0 {
		totalBytes = int64(v) << 20
	}
	return files, totalBytes
}

// benchTree writes a deterministic tree of incompressible files, 100 per directory, under dir and
// returns the relative file names and the total size.
func benchTree(b *testing.B, dir string) ([]string, int64) {
	b.Helper()
	files, total := benchSize()
	rng := rand.New(rand.NewChaCha8([32]byte{1}))
	per := total / int64(files)
	buf := make([]byte, 2*per+1)
	var names []string
	var sum int64
	for i := range files {
		name := filepath.Join(fmt.Sprintf("d%03d", i/100), fmt.Sprintf("f%05d.dat", i))
		size := per/2 + rng.Int64N(per+1) // sizes vary around the mean
		for j := range buf[:size] {
			buf[j] = byte(rng.Uint32())
		}
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, buf[:size], 0o644); err != nil {
			b.Fatal(err)
		}
		names = append(names, filepath.ToSlash(name))
		sum += size
	}
	settle(b)
	return names, sum
}

// settle flushes dirty pages so that writeback of one step does not slow the next timed one (the
// first of a pair would otherwise pay for the tree it just generated).
func settle(b *testing.B) {
	b.Helper()
	b.StopTimer()
	unix.Sync()
	b.StartTimer()
}

func runSh(b *testing.B, script string) {
	b.Helper()
	out, err := exec.Command("sh", "-c", script).CombinedOutput()
	if err != nil {
		b.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// BenchmarkCapsulePack compares Pack (tar + per-file SHA-256 + tree digest) with
// `tar -c | sha256sum` over the same tree.
func BenchmarkCapsulePack(b *testing.B) {
	src := b.TempDir()
	_, total := benchTree(b, src)
	ctx := context.Background()
	b.Run("berth", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			if _, err := Pack(ctx, src, io.Discard); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tar|sha256sum", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			runSh(b, "tar -cf - -C "+src+" . | sha256sum >/dev/null")
		}
	})
}

// BenchmarkRealizeCopy compares RealizeCopy (filtered copy + manifest + digest) with `cp -a`.
func BenchmarkRealizeCopy(b *testing.B) {
	src := b.TempDir()
	_, total := benchTree(b, src)
	ctx := context.Background()
	b.Run("berth", func(b *testing.B) {
		m, err := NewManager(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(total)
		for b.Loop() {
			res, err := m.RealizeCopy(ctx, src)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := m.Destroy(ctx, res.Ref); err != nil {
				b.Fatal(err)
			}
			unix.Sync()
			b.StartTimer()
		}
	})
	b.Run("cp-a", func(b *testing.B) {
		dst := filepath.Join(b.TempDir(), "copy")
		b.SetBytes(total)
		for b.Loop() {
			runSh(b, "cp -a "+src+" "+dst)
			b.StopTimer()
			if err := os.RemoveAll(dst); err != nil {
				b.Fatal(err)
			}
			unix.Sync()
			b.StartTimer()
		}
	})
}

// BenchmarkRealizeGitWorktree compares RealizeGitWorktree (branch rendering and validation, base
// resolution, reuse checks, worktree add) with a bare `git worktree add -b`.
func BenchmarkRealizeGitWorktree(b *testing.B) {
	repo := b.TempDir()
	gitT(b, repo, "init", "-q", "-b", "main")
	benchTree(b, repo)
	gitT(b, repo, "add", "-A")
	gitT(b, repo, "commit", "-q", "-m", "tree")
	settle(b)
	ctx := context.Background()
	b.Run("berth", func(b *testing.B) {
		m, err := NewManager(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		i := 0
		for b.Loop() {
			i++
			res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: fmt.Sprintf("B-%d", i)})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := m.Destroy(ctx, res.Ref); err != nil {
				b.Fatal(err)
			}
			unix.Sync()
			b.StartTimer()
		}
	})
	b.Run("git-worktree-add", func(b *testing.B) {
		dir := b.TempDir()
		i := 0
		for b.Loop() {
			i++
			wt := filepath.Join(dir, strconv.Itoa(i))
			runSh(b, fmt.Sprintf("cd %s && git -c gc.auto=0 worktree add -q -b plain/%d %s main", repo, i, wt))
			b.StopTimer()
			runSh(b, fmt.Sprintf("cd %s && git worktree remove --force %s", repo, wt))
			unix.Sync()
			b.StartTimer()
		}
	})
}

// BenchmarkFileRead compares downloads through the file-resource resolver with http.FileServer over
// the same files, both over loopback HTTP; "berth-direct" is the resolver without HTTP.
func BenchmarkFileRead(b *testing.B) {
	root := b.TempDir()
	names, _ := benchTree(b, root)
	files, err := NewFiles(FileLimits{}, FileRoot{Name: "w", Dir: root})
	if err != nil {
		b.Fatal(err)
	}
	berth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, e, err := files.Open(r.Context(), "w", r.URL.Path[1:])
		if err != nil {
			http.Error(w, "refused", http.StatusForbidden)
			return
		}
		defer f.Close()
		http.ServeContent(w, r, e.Name, e.ModifiedAt, f)
	}))
	defer berth.Close()
	stdlib := httptest.NewServer(http.FileServer(http.Dir(root)))
	defer stdlib.Close()
	get := func(b *testing.B, base string, i int) {
		resp, err := http.Get(base + "/" + names[i%len(names)])
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || n == 0 {
			b.Fatalf("status %d, %d bytes", resp.StatusCode, n)
		}
	}
	// Warm-up: every file once through each server, so both measure page-cache reads.
	for i := range names {
		get(b, berth.URL, i)
		get(b, stdlib.URL, i)
	}
	for _, srv := range []struct{ name, url string }{{"berth", berth.URL}, {"http.FileServer", stdlib.URL}} {
		b.Run(srv.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				get(b, srv.url, i)
				i++
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reads/s")
		})
	}
	b.Run("berth-direct", func(b *testing.B) {
		ctx := context.Background()
		i := 0
		for b.Loop() {
			if _, err := files.Read(ctx, "w", names[i%len(names)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reads/s")
	})
}
