// Package spool keeps the outcomes of runs on this node's disk until the database has them
// (docs/runs.md "Durability"): when a run's command ends, its executor writes the outcome (status,
// exit code, error code and message, the kept log) to <data dir>/spool/runs/<run id>.json before
// it tries to record it in the database, and removes the file once the database has it. A
// database outage therefore costs nothing but time: the executor retries until the write lands
// (Dir.Record), and a process that dies meanwhile leaves the file for its successor on the node
// to replay at startup (Dir.Replay). The spool lives under the data dir, which every jailed
// command has masked, never inside a workspace.
//
// The package owns the spool directory and the retry and replay loops, their timing and their
// log lines. It does not write the database itself: the run's final transaction (which enqueues
// finalize) is package jobs', handed in as a Writer, and it imports nothing of jobs.
package spool

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"berth/db"
	"berth/environment/datadir"
)

// Outcome is a run's end as its executor saw it: everything its final transaction writes.
type Outcome struct {
	RunID        string `json:"run_id"`
	Status       string `json:"status"`
	ErrorCode    string `json:"error_code"`
	ErrorMessage string `json:"error_message"`
	// ExitCode is the command's exit status; nil when it never started.
	ExitCode     *int   `json:"exit_code,omitempty"`
	Log          []byte `json:"log"`
	LogHead      int    `json:"log_head"`
	LogTotal     int64  `json:"log_total"`
	LogTruncated bool   `json:"log_truncated"`
}

// RunLog is the kept log as the run row stores it.
func (o Outcome) RunLog() db.RunLog {
	return db.RunLog{Data: o.Log, Head: o.LogHead, Total: o.LogTotal, Truncated: o.LogTruncated}
}

// Dir is one node's directory of outcomes not yet in the database. The zero Dir (no data dir)
// keeps nothing on disk: the executor still holds the outcome in memory and retries.
type Dir struct {
	dir string
}

// Of is the spool under a data dir.
func Of(data datadir.Layout) Dir {
	if data.Root == "" {
		return Dir{}
	}
	return Dir{dir: data.RunSpool()}
}

// path is where a run's outcome is spooled; ok is false for an id that is not a plain UUID, which
// never names a file.
func (s Dir) path(runID string) (string, bool) {
	if s.dir == "" || !validRunID(runID) {
		return "", false
	}
	return filepath.Join(s.dir, runID+".json"), true
}

// validRunID accepts the 36-character lowercase hex UUID form runs are stored with.
func validRunID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i, c := range id {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case (c < '0' || c > '9') && (c < 'a' || c > 'f'):
			return false
		}
	}
	return true
}

// Has reports whether an outcome of runID waits in the spool: the orphan sweep leaves such a run
// alone, since its outcome is known and on its way.
func (s Dir) Has(runID string) bool {
	p, ok := s.path(runID)
	if !ok {
		return false
	}
	_, err := os.Lstat(p)
	return err == nil
}

// Save writes o atomically (temporary file, fsync, rename, directory fsync; mode 0600 in a 0700
// directory), replacing an earlier outcome of the same run.
func (s Dir) Save(o Outcome) error {
	p, ok := s.path(o.RunID)
	if !ok {
		if s.dir == "" {
			return nil
		}
		return fmt.Errorf("spool run %q: not a run id", o.RunID)
	}
	data, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("spool run %s: %w", o.RunID, err)
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("spool run %s: %w", o.RunID, err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	tmp := filepath.Join(s.dir, ".tmp-"+hex.EncodeToString(b[:]))
	if err := writeSynced(tmp, data); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("spool run %s: %w", o.RunID, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("spool run %s: %w", o.RunID, err)
	}
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("spool run %s: %w", o.RunID, err)
	}
	return nil
}

// writeSynced creates path (mode 0600, which must not exist), writes data and fsyncs it.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncDir fsyncs a directory so a rename or removal in it is durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// remove forgets runID's outcome once the database holds it (or can never take it).
func (s Dir) remove(runID string) error {
	p, ok := s.path(runID)
	if !ok {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("unspool run %s: %w", runID, err)
	}
	return nil
}

// errCorrupt marks a spool file that does not decode into an outcome of the run it names.
var errCorrupt = errors.New("spool file is corrupt")

// load reads runID's spooled outcome.
func (s Dir) load(runID string) (Outcome, error) {
	var o Outcome
	p, ok := s.path(runID)
	if !ok {
		return o, fmt.Errorf("spool run %q: %w", runID, fs.ErrNotExist)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return o, fmt.Errorf("read spooled run %s: %w", runID, err)
	}
	if err := json.Unmarshal(data, &o); err != nil || o.RunID != runID || o.Status == "" {
		return Outcome{}, fmt.Errorf("read spooled run %s: %w", runID, errCorrupt)
	}
	return o, nil
}

// List is the run ids with a spooled outcome (leftover temporary files are not outcomes).
func (s Dir) List() ([]string, error) {
	if s.dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list spool: %w", err)
	}
	var ids []string
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if ok && e.Type().IsRegular() && validRunID(id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// quarantine moves a corrupt spool file aside (<id>.json.corrupt) so it no longer holds its run
// back from the orphan sweep, and keeps it for an administrator to read.
func (s Dir) quarantine(runID string) error {
	p, ok := s.path(runID)
	if !ok {
		return nil
	}
	if err := os.Rename(p, p+".corrupt"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("quarantine spooled run %s: %w", runID, err)
	}
	return nil
}

// staleTempAge: a spool temporary file this old belongs to a save that can no longer finish (a
// save takes milliseconds; its process was killed between write and rename).
const staleTempAge = 10 * time.Minute

// sweepTemps removes temporary files that saves killed midway left behind.
func (s Dir) sweepTemps() {
	if s.dir == "" {
		return
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTempAge {
			_ = os.Remove(filepath.Join(s.dir, e.Name()))
		}
	}
}
