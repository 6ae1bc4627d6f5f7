package workspace

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
)

// List returns the workspaces this Manager owns, sorted by ref.
func (m *Manager) List(ctx context.Context) ([]Listing, error) {
	names, err := readDirNames(ctx, m.base)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	var out []Listing
	for _, n := range names {
		ref, ok := strings.CutSuffix(n, recordSuffix)
		if !ok || !ValidRef(ref) {
			continue
		}
		rec, err := m.readRecord(ref)
		if err != nil {
			continue
		}
		l := Listing{Ref: ref, Strategy: rec.Strategy}
		if rec.Strategy != StrategyShared {
			if _, err := m.owned(ref); err != nil {
				l.Missing = true
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// Unmanaged reports the names of entries under the base that no record owns (left-over staging
// directories, directories created by hand, replaced roots). They are reported, never deleted.
func (m *Manager) Unmanaged(ctx context.Context) ([]string, error) {
	names, err := readDirNames(ctx, m.base)
	if err != nil {
		return nil, fmt.Errorf("unmanaged: %w", err)
	}
	var out []string
	for _, n := range names {
		if ref, ok := strings.CutSuffix(n, recordSuffix); ok && ValidRef(ref) {
			continue
		}
		if ref, ok := strings.CutSuffix(n, manifestSuffix); ok && ValidRef(ref) {
			continue
		}
		if strings.HasPrefix(n, ".record-") { // an in-flight atomic write
			continue
		}
		if ValidRef(n) {
			if _, err := m.owned(n); err == nil {
				continue
			}
		}
		out = append(out, n)
	}
	return out, nil
}

func readDirNames(ctx context.Context, dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		batch, err := f.Readdirnames(1024)
		names = append(names, batch...)
		if err != nil {
			break
		}
	}
	sort.Strings(names)
	return names, nil
}
