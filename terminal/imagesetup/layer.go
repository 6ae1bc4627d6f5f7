package imagesetup

import "os"

// copyLayer copies the session's base version into its scratch layer, whole. Version 1 is the
// empty layer, made on first use.
func (n *Sessions) copyLayer(s Session) error {
	base := n.Data.ImageLayer(s.EnvironmentID, s.BaseVersion)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	return os.CopyFS(n.Data.ScratchLayer(s.EnvironmentID, s.ID), os.DirFS(base))
}
