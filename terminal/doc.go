// Package terminal bridges an instance administrator's browser to a setup sandbox's pty over a
// token-checked WebSocket: terminal tokens are single-use and short-lived, one client is attached
// at a time, and the pty outlives a dropped connection for a grace period. The bridge arrives with
// the custom-images issue; this package reserves its place in the layout.
package terminal
