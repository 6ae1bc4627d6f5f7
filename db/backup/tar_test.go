package backup

import (
	"archive/tar"
	"bytes"
	"io"
)

// tarBuilder writes hand-made tar streams for the refusal tests.
type tarBuilder struct {
	buf bytes.Buffer
	tw  *tar.Writer
}

func newTarBuilder() *tarBuilder {
	b := &tarBuilder{}
	b.tw = tar.NewWriter(&b.buf)
	return b
}

func (b *tarBuilder) file(name, content string) {
	_ = b.tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))})
	_, _ = b.tw.Write([]byte(content))
}

func (b *tarBuilder) symlink(name, target string) {
	_ = b.tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777})
}

func (b *tarBuilder) reader() io.Reader {
	_ = b.tw.Close()
	return &b.buf
}
