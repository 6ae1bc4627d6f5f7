package terminal

// ring keeps the last len(buf) bytes of a pty's output, addressed by absolute offsets (bytes
// ever written), so each client reads from its own position and a reconnecting one replays what
// is still held. The caller serializes access.
type ring struct {
	buf []byte
	end int64 // offset just after the last byte written
}

func newRing(size int) *ring { return &ring{buf: make([]byte, size)} }

// start is the offset of the oldest byte still held.
func (r *ring) start() int64 { return max(0, r.end-int64(len(r.buf))) }

func (r *ring) write(p []byte) {
	if len(p) > len(r.buf) {
		r.end += int64(len(p) - len(r.buf))
		p = p[len(p)-len(r.buf):]
	}
	for len(p) > 0 {
		i := int(r.end % int64(len(r.buf)))
		n := copy(r.buf[i:], p)
		p = p[n:]
		r.end += int64(n)
	}
}

// read copies bytes from offset off into dst and returns how many and the next offset. lagged
// reports that off is older than the ring holds (the bytes in between are lost for that reader).
func (r *ring) read(off int64, dst []byte) (n int, next int64, lagged bool) {
	if off < r.start() {
		return 0, off, true
	}
	for n < len(dst) && off < r.end {
		i := int(off % int64(len(r.buf)))
		stop := len(r.buf)
		if lim := i + int(r.end-off); lim < stop {
			stop = lim
		}
		c := copy(dst[n:], r.buf[i:stop])
		n += c
		off += int64(c)
	}
	return n, off, false
}
