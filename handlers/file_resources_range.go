package handlers

import (
	"net/http"
	"net/url"
	"strconv"

	"berth/workspace"
)

// fileRange reads a content request's range: offset and length (bytes), or start_line and
// end_line (1-based, inclusive); ranged is false when none is given.
func fileRange(q url.Values) (rg workspace.Range, ranged bool, err error) {
	num := func(name string, dst *int64) error {
		v := q.Get(name)
		if v == "" {
			return nil
		}
		ranged = true
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return badRequest("bad_range", name+" must be a whole number, 0 or more.")
		}
		*dst = n
		return nil
	}
	var start, end int64
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"offset", &rg.Offset}, {"length", &rg.Length}, {"start_line", &start}, {"end_line", &end}} {
		if err := num(f.name, f.dst); err != nil {
			return rg, false, err
		}
	}
	if start > 1<<31 || end > 1<<31 {
		return rg, false, badRequest("bad_range", "Line numbers are at most 2147483648.")
	}
	rg.StartLine, rg.EndLine = int(start), int(end)
	if rg.EndLine > 0 && rg.StartLine == 0 {
		rg.StartLine = 1
	}
	if rg.StartLine > 0 && (rg.Offset > 0 || rg.Length > 0) {
		return rg, false, badRequest("bad_range", "Give a byte range (offset, length) or a line range (start_line, end_line), not both.")
	}
	if rg.EndLine > 0 && rg.EndLine < rg.StartLine {
		return rg, false, badRequest("bad_range", "end_line comes before start_line.")
	}
	return rg, ranged, nil
}

// readFileRange spends a rate-limit token and returns part of a file of root.
func (s *Server) readFileRange(w http.ResponseWriter, r *http.Request, a access, lim *rateLimiter, taskID string, tf taskFiles, root fileRoot, in fileQuery, rg workspace.Range) error {
	if err := s.admitFileRead(w, r, a, lim, taskID, root.Name, in); err != nil {
		return err
	}
	if root.node != "" {
		return errRootOnOtherNode // file_resources_write.go
	}
	c, err := tf.files.ReadRange(r.Context(), root.Name, in.Path, rg)
	if err != nil {
		return s.fileRefusal(r, a, taskID, root.Name, in, err)
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}
