package workspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// Range picks part of a file for ReadRange: bytes from Offset (at most Length, 0 meaning up to
// the preview cap), or, when StartLine is set, lines StartLine to EndLine (1-based, inclusive; 0
// means to the end). Either way at most PreviewBytes come back.
type Range struct {
	Offset    int64
	Length    int64
	StartLine int
	EndLine   int
}

// RangeContent is a part of a file: Content (Truncated says the file goes on after it) plus
// where the part lies.
type RangeContent struct {
	Content
	Offset    int64 `json:"offset"`               // byte offset of the part
	StartLine int   `json:"start_line,omitempty"` // first line returned (line ranges)
	EndLine   int   `json:"end_line,omitempty"`   // last line returned (line ranges)
}

// ReadRange returns part of a file under the same rules as Read.
func (f *Files) ReadRange(ctx context.Context, root, p string, rg Range) (RangeContent, error) {
	if rg.Offset < 0 || rg.Length < 0 || rg.StartLine < 0 || rg.EndLine < 0 ||
		(rg.EndLine > 0 && rg.EndLine < rg.StartLine) || (rg.StartLine > 0 && (rg.Offset > 0 || rg.Length > 0)) {
		return RangeContent{}, fmt.Errorf("read range: bad range: %w", ErrBadPath)
	}
	r, err := f.openFile(ctx, root, p)
	if err != nil {
		return RangeContent{}, fmt.Errorf("read range: %w", err)
	}
	file := os.NewFile(uintptr(r.fd), r.rel)
	defer file.Close()
	limit := f.lim.PreviewBytes
	if rg.StartLine == 0 {
		n := limit
		if rg.Length > 0 {
			n = min(n, rg.Length)
		}
		n = max(0, min(n, r.st.Size-rg.Offset))
		buf := make([]byte, n)
		k, err := file.ReadAt(buf, rg.Offset)
		if err != nil && !errors.Is(err, io.EOF) {
			return RangeContent{}, fmt.Errorf("read range %q: %w", r.rel, err)
		}
		buf = buf[:k]
		truncated := rg.Offset+int64(k) < r.st.Size
		enc, text := sniff(buf, truncated)
		return RangeContent{Content: Content{Path: r.rel, Size: r.st.Size, Encoding: enc, Content: text, Truncated: truncated},
			Offset: rg.Offset}, nil
	}
	br := bufio.NewReaderSize(file, 64<<10)
	var out []byte
	var offset int64
	line, last := 0, 0
	truncated := false
	for {
		if line%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return RangeContent{}, err
			}
		}
		b, err := br.ReadSlice('\n')
		for errors.Is(err, bufio.ErrBufferFull) && int64(len(b)) <= limit { // a long line, in pieces (bounded)
			var more []byte
			more, err = br.ReadSlice('\n')
			b = append(append([]byte(nil), b...), more...)
		}
		if len(b) == 0 && err != nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) { // a line over the cap: it cannot be returned
			truncated = line+1 >= rg.StartLine
			if !truncated {
				return RangeContent{}, fmt.Errorf("read range %q: a line before the range is over %d bytes: %w", r.rel, limit, ErrTooLarge)
			}
			break
		}
		line++
		switch {
		case line < rg.StartLine:
			offset += int64(len(b))
		case rg.EndLine > 0 && line > rg.EndLine:
			truncated = true
		case int64(len(out)+len(b)) > limit:
			truncated = true
		default:
			out = append(out, b...)
			last = line
		}
		if truncated || err != nil {
			break
		}
	}
	enc, text := sniff(out, truncated)
	return RangeContent{Content: Content{Path: r.rel, Size: r.st.Size, Encoding: enc, Content: text, Truncated: truncated},
		Offset: offset, StartLine: rg.StartLine, EndLine: last}, nil
}
