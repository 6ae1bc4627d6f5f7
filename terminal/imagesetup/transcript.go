package imagesetup

import (
	"os"
	"path/filepath"

	"berth/terminal"
)

// transcript is session id's transcript file, <data dir>/setup-sessions/<id>/transcript (0600
// in a 0700 directory, beside the shell's workspace), its directory made.
func (n *Sessions) transcript(id string) terminal.TranscriptFile {
	dir := n.Data.SetupSession(id)
	_ = os.MkdirAll(dir, 0o700)
	return terminal.TranscriptFile(filepath.Join(dir, "transcript"))
}
