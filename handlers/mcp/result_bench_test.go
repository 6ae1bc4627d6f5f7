package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkMCPTextResult is the SDK's own floor under BenchmarkMCPFileRead (handlers): a tool
// whose result is a 64 KiB text, read with the SDK's client over loopback, with the SDK's
// encoding of the result and with flatResults, against a plain JSON handler of the same answer
// read with net/http and encoding/json; no database, no Berth, interleaved; p50 of each.
func BenchmarkMCPTextResult(b *testing.B) {
	line := bytes.Repeat([]byte("0123456789abcdef"), 4) // 64 bytes with the newline
	line[63] = '\n'
	text := string(bytes.Repeat(line, 1024))
	meta := map[string]any{"path": "big.txt", "size": float64(len(text)), "encoding": "utf8", "truncated": false}
	sdkCS, base := textServer(b, text, meta, false)
	flatCS, _ := textServer(b, text, meta, true)
	read := func(cs *sdk.ClientSession) {
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "read", Arguments: map[string]any{}})
		if err != nil || len(res.Content[0].(*sdk.TextContent).Text) != len(text) {
			b.Fatalf("read: %v", err)
		}
	}
	var plain, viaSDK, flat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		resp, err := http.Get(base + "/rest")
		if err != nil {
			b.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil || len(out["content"].(string)) != len(text) {
			b.Fatalf("plain read: %v", err)
		}
		plain = append(plain, time.Since(start))
		start = time.Now()
		read(sdkCS)
		viaSDK = append(viaSDK, time.Since(start))
		start = time.Now()
		read(flatCS)
		flat = append(flat, time.Since(start))
	}
	b.StopTimer()
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(p50(plain), "json-p50-ms")
	b.ReportMetric(p50(viaSDK), "sdk-p50-ms")
	b.ReportMetric(p50(flat), "flat-p50-ms")
}
