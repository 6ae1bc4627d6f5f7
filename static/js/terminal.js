// The setup session's terminal (docs/terminal.md): xterm.js with the fit addon over the session's
// WebSocket. Each (re)connect mints a fresh single-use token with the page's session cookie and
// sends it as the first frame, never in the URL. The server replays its scrollback after
// "ready", so the screen is reset first. A dropped connection reconnects by itself with backoff;
// a session that was finished, cancelled, timed out or opened elsewhere stops reconnecting.
(function () {
	"use strict";

	var root = document.getElementById("setup-session");
	var el = document.getElementById("terminal");
	if (!root || !el || !window.Terminal || !window.FitAddon) {
		return;
	}
	var id = root.getAttribute("data-session-id");
	var stateEl = document.getElementById("terminal-state");
	var term = new window.Terminal({ cursorBlink: true, scrollback: 10000 });
	var fit = new window.FitAddon.FitAddon();
	term.loadAddon(fit);
	term.open(el);
	fit.fit();

	var ws = null;
	var ready = false;
	var final = false;
	var delay = 500;
	var encoder = new TextEncoder();
	var finalReasons = {
		replaced: "opened in another window",
		setup_finished: "finished: capturing the image",
		setup_cancelled: "cancelled",
		setup_timed_out: "timed out",
	};

	function state(text) {
		if (stateEl) {
			stateEl.textContent = text;
		}
		root.setAttribute("data-terminal", text);
	}

	function control(obj) {
		if (ws && ready && ws.readyState === WebSocket.OPEN) {
			ws.send(JSON.stringify(obj));
		}
	}

	function sendSize() {
		control({ type: "resize", cols: term.cols, rows: term.rows });
	}

	term.onData(function (data) {
		if (ws && ready && ws.readyState === WebSocket.OPEN) {
			ws.send(encoder.encode(data));
		}
	});
	term.onResize(sendSize);
	window.addEventListener("resize", function () {
		fit.fit();
	});

	function retry() {
		if (final) {
			return;
		}
		state("reconnecting…");
		setTimeout(connect, delay);
		delay = Math.min(delay * 2, 10000);
	}

	function connect() {
		state("connecting…");
		fetch("/api/image-setup-sessions/" + encodeURIComponent(id) + "/terminal-token", {
			method: "POST",
			credentials: "same-origin",
			headers: { Accept: "application/json" },
		})
			.then(function (resp) {
				if (resp.status === 409 || resp.status === 404 || resp.status === 403) {
					final = true;
					state("the session is no longer open");
					throw new Error("closed");
				}
				if (!resp.ok) {
					throw new Error("token " + resp.status);
				}
				return resp.json();
			})
			.then(function (t) {
				var scheme = location.protocol === "https:" ? "wss:" : "ws:";
				var sock = new WebSocket(scheme + "//" + location.host + "/api/image-setup-sessions/" +
					encodeURIComponent(id) + "/terminal");
				sock.binaryType = "arraybuffer";
				ws = sock;
				ready = false;
				sock.onopen = function () {
					sock.send(JSON.stringify({ type: "auth", token: t.token }));
				};
				sock.onmessage = function (ev) {
					if (sock !== ws) {
						return;
					}
					if (typeof ev.data !== "string") {
						term.write(new Uint8Array(ev.data));
						return;
					}
					var msg;
					try {
						msg = JSON.parse(ev.data);
					} catch (e) {
						return;
					}
					switch (msg.type) {
						case "ready":
							ready = true;
							delay = 500;
							term.reset(); // the scrollback follows
							state("connected");
							fit.fit();
							sendSize();
							term.focus();
							break;
						case "exit":
							term.write("\r\n[the shell exited with code " + msg.code + "; a new one starts on reconnect]\r\n");
							sock.close();
							break;
						case "closed":
							if (finalReasons[msg.reason]) {
								final = true;
								state(finalReasons[msg.reason]);
								if (msg.reason !== "replaced") {
									setTimeout(function () { location.reload(); }, 1000);
								}
							}
							break;
						case "error":
							state("refused: " + msg.message);
							break;
					}
				};
				sock.onclose = function () {
					if (sock === ws) {
						ws = null;
						ready = false;
						retry();
					}
				};
			})
			.catch(function () {
				retry();
			});
	}

	connect();
})();
