package terminal

import "os"

// TranscriptFile is a session's transcript kept in a file: each write opens it (0600, created
// when missing), appends and closes, so nothing is held open between a shell's outputs. The
// registry caps how much it is given (Options.TranscriptMax).
type TranscriptFile string

// Write appends b to the file.
func (t TranscriptFile) Write(b []byte) (int, error) {
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
