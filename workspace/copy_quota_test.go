package workspace

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCopyQuota proves that a source over the byte or file quota is refused with
// ErrSourceTooLarge before any root is created, and that one at the limit is copied in full.
func TestCopyQuota(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a.txt": "12345", "sub/b.txt": "67890", "sub/c.txt": "x"})
	cases := []struct {
		name    string
		opts    Options
		refused string
	}{
		{"bytes over", Options{CopyMaxBytes: 10}, "BERTH_COPY_MAX_BYTES"},
		{"files over", Options{CopyMaxFiles: 2}, "BERTH_COPY_MAX_FILES"},
		{"at the limits", Options{CopyMaxBytes: 11, CopyMaxFiles: 3}, ""},
		{"defaults", Options{}, ""},
	}
	for _, tc := range cases {
		dataDir := t.TempDir()
		m, err := NewManager(dataDir, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		res, err := m.RealizeCopy(ctx, src)
		entries, _ := os.ReadDir(filepath.Join(dataDir, "workspaces"))
		if tc.refused != "" {
			if !errors.Is(err, ErrSourceTooLarge) || !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("%s: err %v, want ErrSourceTooLarge naming %s", tc.name, err, tc.refused)
			}
			if len(entries) != 0 {
				t.Errorf("%s: refused copy left %d entries in the workspace base", tc.name, len(entries))
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		root, err := m.Root(res.Ref)
		if err != nil {
			t.Fatal(err)
		}
		for rel, want := range map[string]string{"a.txt": "12345", "sub/b.txt": "67890", "sub/c.txt": "x"} {
			if got := mustRead(t, filepath.Join(root, rel)); got != want {
				t.Errorf("%s: %s = %q, want %q", tc.name, rel, got, want)
			}
		}
	}
}

// TestCopyParallelManifest copies many files of varied sizes (empty, small, larger than the copy
// buffer) with the parallel copier and checks every byte and every manifest entry against the source.
func TestCopyParallelManifest(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := t.TempDir()
	want := map[string][]byte{}
	for i := range 300 {
		b := bytes.Repeat([]byte{byte(i)}, (i*7919)%5000)
		if i%50 == 0 {
			b = bytes.Repeat([]byte("large "), 200_000) // 1.2 MB
		}
		rel := filepath.Join("d"+string(rune('a'+i%7)), "f"+strings.Repeat("x", i%5)+string(rune('0'+i%10))+".bin")
		if _, dup := want[rel]; dup {
			continue
		}
		mustDo(t, os.MkdirAll(filepath.Join(src, filepath.Dir(rel)), 0o755))
		mustDo(t, os.WriteFile(filepath.Join(src, rel), b, 0o644))
		want[rel] = b
	}
	m := newTestManager(t)
	res, err := m.RealizeCopy(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	root, err := m.Root(res.Ref)
	if err != nil {
		t.Fatal(err)
	}
	for rel, b := range want {
		got, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s: copy differs (%v)", rel, err)
		}
	}
	man, err := m.BaseManifest(res.Ref)
	if err != nil {
		t.Fatal(err)
	}
	packed, err := Pack(ctx, root, io.Discard) // hashes every byte of the copy again, sequentially
	if err != nil {
		t.Fatal(err)
	}
	if man.Digest() != packed.Manifest.Digest() || man.Digest() != res.TreeDigest || len(man.Entries) != len(packed.Manifest.Entries) {
		t.Fatalf("manifest digest %s, rescanned %s, result %s", man.Digest(), packed.Manifest.Digest(), res.TreeDigest)
	}
}
