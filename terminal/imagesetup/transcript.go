package imagesetup

import (
	"os"
	"path/filepath"
)

// transcriptFile appends a session's shell output to its transcript file,
// <data dir>/setup-sessions/<id>/transcript (0600 in a 0700 directory, beside the shell's
// workspace; the registry caps how much it is given). Each write opens, appends and closes, so
// nothing is held open between a shell's outputs.
type transcriptFile string

func (t transcriptFile) Write(b []byte) (int, error) {
	f, err := os.OpenFile(string(t), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// transcript is session id's transcript file, its directory made.
func (n *Sessions) transcript(id string) transcriptFile {
	dir := n.Data.SetupSession(id)
	_ = os.MkdirAll(dir, 0o700)
	return transcriptFile(filepath.Join(dir, "transcript"))
}
