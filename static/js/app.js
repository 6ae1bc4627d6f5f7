// Berth page behaviour. Loaded after htmx on every page; no inline script
// anywhere, because the CSP is default-src 'self'.
(function () {
	"use strict";

	// htmx would inject an inline <style> for its indicators (blocked by the
	// CSP; app.css carries those rules) and evaluate hx-on / js: expressions
	// (blocked too, no unsafe-eval). Turn both off so they fail quietly.
	// htmx applies these on DOMContentLoaded, which comes after this script.
	if (window.htmx) {
		window.htmx.config.includeIndicatorStyles = false;
		window.htmx.config.allowEval = false;
		// Forms answer a refused submission (422 validation, 409 conflict) with the form
		// and its messages: swap those like a success. Other errors are not swapped.
		window.htmx.config.responseHandling = [
			{ code: "204", swap: false },
			{ code: "[23]..", swap: true },
			{ code: "422", swap: true },
			{ code: "409", swap: true },
			{ code: "[45]..", swap: false, error: true },
		];
	}

	// A page reached with ?flash=code shows its confirmation once (handlers/flash.go): drop the
	// parameter from the address so a reload or a bookmark does not repeat it.
	if (window.history && window.history.replaceState && /[?&]flash=/.test(window.location.search)) {
		var url = new URL(window.location.href);
		url.searchParams.delete("flash");
		window.history.replaceState(window.history.state, "", url.pathname + url.search + url.hash);
	}

	// <form data-confirm="Delete this workspace?"> (or a submit button with
	// data-confirm) asks before submitting. The capture phase runs before
	// htmx's own submit listener, so this guards hx-post forms as well.
	document.addEventListener("submit", function (event) {
		var form = event.target;
		var submitter = event.submitter;
		var question =
			(submitter && submitter.getAttribute("data-confirm")) ||
			(form instanceof HTMLFormElement && form.getAttribute("data-confirm"));
		if (question && !window.confirm(question)) {
			event.preventDefault();
			event.stopImmediatePropagation();
		}
	}, true);

	// Buttons with data-loading-text show that text and are disabled while
	// the htmx request they started is in flight.
	var busy = new WeakMap(); // XMLHttpRequest -> [{button, html, disabled}]

	function loadingButtons(detail) {
		var elt = detail.elt;
		if (elt.matches("button[data-loading-text]")) {
			return [elt];
		}
		var cfg = detail.requestConfig;
		var submitter = cfg && cfg.triggeringEvent && cfg.triggeringEvent.submitter;
		if (submitter && submitter.matches("[data-loading-text]")) {
			return [submitter];
		}
		if (elt instanceof HTMLFormElement) {
			return Array.prototype.slice.call(
				elt.querySelectorAll("button[data-loading-text]"));
		}
		return [];
	}

	document.addEventListener("htmx:beforeRequest", function (event) {
		var buttons = loadingButtons(event.detail);
		if (buttons.length === 0) {
			return;
		}
		busy.set(event.detail.xhr, buttons.map(function (button) {
			var saved = { button: button, html: button.innerHTML, disabled: button.disabled };
			button.textContent = button.getAttribute("data-loading-text");
			button.disabled = true;
			button.setAttribute("aria-busy", "true");
			return saved;
		}));
	});

	// htmx fires afterRequest for success, error, abort and timeout alike.
	document.addEventListener("htmx:afterRequest", function (event) {
		var saved = busy.get(event.detail.xhr);
		if (!saved) {
			return;
		}
		busy.delete(event.detail.xhr);
		saved.forEach(function (s) {
			s.button.innerHTML = s.html;
			s.button.disabled = s.disabled;
			s.button.removeAttribute("aria-busy");
		});
	});

	// ---------- The shell: the section menu, <details> menus, the theme toggle ----------

	var navToggle = document.getElementById("nav-toggle");
	var mainnav = document.getElementById("mainnav");
	if (navToggle && mainnav) {
		navToggle.addEventListener("click", function () {
			var open = !mainnav.classList.contains("open");
			mainnav.classList.toggle("open", open);
			navToggle.setAttribute("aria-expanded", open ? "true" : "false");
		});
	}

	function closeMenus(except) {
		document.querySelectorAll("details.menu[open]").forEach(function (d) {
			if (d !== except && !d.contains(except)) {
				d.open = false;
			}
		});
	}
	document.addEventListener("click", function (event) {
		var inside = event.target.closest && event.target.closest("details.menu");
		closeMenus(inside);
	});

	var themes = ["system", "light", "dark"];
	var themeWords = { system: "follows the system", light: "light", dark: "dark" };
	function currentTheme() {
		var t = document.documentElement.getAttribute("data-theme");
		return t === "light" || t === "dark" ? t : "system";
	}
	function showTheme(button) {
		var label = "Theme: " + themeWords[currentTheme()];
		button.setAttribute("aria-label", label);
		button.setAttribute("title", label + " (click to change)");
	}
	var themeToggle = document.getElementById("theme-toggle");
	if (themeToggle) {
		showTheme(themeToggle);
		themeToggle.addEventListener("click", function () {
			var next = themes[(themes.indexOf(currentTheme()) + 1) % themes.length];
			if (next === "system") {
				document.documentElement.removeAttribute("data-theme");
			} else {
				document.documentElement.setAttribute("data-theme", next);
			}
			try {
				if (next === "system") {
					window.localStorage.removeItem("berth-theme");
				} else {
					window.localStorage.setItem("berth-theme", next);
				}
			} catch (e) {
				// Not stored: the choice lasts until the next page.
			}
			showTheme(themeToggle);
		});
	}

	// ---------- The command palette (Ctrl-K or /) ----------

	var palette = document.getElementById("palette");
	var paletteInput = document.getElementById("palette-input");
	var paletteResults = document.getElementById("palette-results");

	function hits() {
		return paletteResults ? Array.prototype.slice.call(paletteResults.querySelectorAll(".palette-hit")) : [];
	}
	function select(i) {
		var all = hits();
		all.forEach(function (h, j) {
			h.classList.toggle("active", j === i);
			h.setAttribute("aria-selected", j === i ? "true" : "false");
		});
		if (all[i]) {
			paletteInput.setAttribute("aria-activedescendant", all[i].id);
			all[i].scrollIntoView({ block: "nearest" });
		} else {
			paletteInput.removeAttribute("aria-activedescendant");
		}
	}
	function selected() {
		var all = hits();
		for (var i = 0; i < all.length; i++) {
			if (all[i].classList.contains("active")) {
				return i;
			}
		}
		return -1;
	}
	function openPalette() {
		if (!palette || palette.open) {
			return;
		}
		closeMenus(null);
		palette.showModal();
		paletteInput.focus();
		paletteInput.select();
	}
	if (palette && paletteInput && paletteResults) {
		var opener = document.getElementById("palette-open");
		if (opener) {
			opener.addEventListener("click", function (event) {
				event.preventDefault();
				openPalette();
			});
		}
		paletteInput.addEventListener("keydown", function (event) {
			var all = hits();
			var i = selected();
			if (event.key === "ArrowDown") {
				event.preventDefault();
				select(all.length ? (i + 1) % all.length : -1);
			} else if (event.key === "ArrowUp") {
				event.preventDefault();
				select(all.length ? (i <= 0 ? all.length - 1 : i - 1) : -1);
			} else if (event.key === "Escape") {
				// A search field would only clear itself on the first Esc: close at once.
				event.preventDefault();
				palette.close();
			}
		});
		// Enter submits the palette's form: open the selected hit (the first by default) instead
		// of the search page, which stays the answer when nothing is listed.
		paletteInput.form.addEventListener("submit", function (event) {
			var all = hits();
			var target = all[selected() >= 0 ? selected() : 0];
			if (target) {
				event.preventDefault();
				window.location.assign(target.getAttribute("href"));
			}
		});
		// New results: the first one is selected, so Enter opens the best match.
		paletteResults.addEventListener("htmx:afterSwap", function () {
			select(hits().length ? 0 : -1);
		});
		palette.addEventListener("click", function (event) {
			if (event.target === palette) {
				palette.close(); // a click on the backdrop
			}
		});
	}

	// ---------- Keyboard shortcuts: / and Ctrl-K search, ? lists, g <key> goes ----------

	var shortcuts = document.getElementById("shortcuts");
	var shortcutsOpen = document.getElementById("shortcuts-open");
	if (shortcuts && shortcutsOpen) {
		shortcutsOpen.addEventListener("click", function () {
			closeMenus(null);
			shortcuts.showModal();
		});
	}
	function typing(el) {
		if (!el) {
			return false;
		}
		var tag = el.tagName;
		return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || el.isContentEditable ||
			(el.closest && el.closest(".terminal, .xterm"));
	}
	var pendingG = 0; // when the last "g" was pressed (ms); a second key within 1.5 s completes it
	document.addEventListener("keydown", function (event) {
		if ((event.ctrlKey || event.metaKey) && !event.altKey && (event.key === "k" || event.key === "K")) {
			if (palette) {
				event.preventDefault();
				if (palette.open) {
					palette.close();
				} else {
					openPalette();
				}
			}
			return;
		}
		if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target) || document.querySelector("dialog[open]")) {
			if (event.key === "Escape") {
				closeMenus(null);
			}
			return;
		}
		if (event.key === "Escape") {
			closeMenus(null);
			if (mainnav && mainnav.classList.contains("open")) {
				navToggle.click();
			}
			return;
		}
		if (pendingG && Date.now() - pendingG < 1500) {
			pendingG = 0;
			var link = document.querySelector('a[data-shortcut="g ' + event.key.toLowerCase() + '"]');
			if (link) {
				event.preventDefault();
				window.location.assign(link.getAttribute("href"));
			}
			return;
		}
		pendingG = 0;
		if (event.key === "/") {
			event.preventDefault();
			openPalette();
		} else if (event.key === "?") {
			if (shortcuts) {
				event.preventDefault();
				closeMenus(null);
				shortcuts.showModal();
			}
		} else if (event.key === "g") {
			pendingG = Date.now();
		}
	});

	// ---------- Live durations: <span data-since="RFC 3339"> counts up while a run runs ----------
	// A clock in the page, not a request: nothing is asked of the server while it ticks.

	function formatDuration(ms) {
		var s = Math.max(0, Math.floor(ms / 1000));
		var h = Math.floor(s / 3600);
		var m = Math.floor((s % 3600) / 60);
		s = s % 60;
		if (h > 0) {
			return h + "h " + (m < 10 ? "0" : "") + m + "m";
		}
		if (m > 0) {
			return m + "m " + (s < 10 ? "0" : "") + s + "s";
		}
		return s + "s";
	}
	function tick() {
		document.querySelectorAll("[data-since]").forEach(function (el) {
			var since = Date.parse(el.getAttribute("data-since"));
			if (!isNaN(since)) {
				el.textContent = formatDuration(Date.now() - since);
			}
		});
	}
	if (document.querySelector("[data-since]") || document.getElementById("run-body")) {
		tick();
		window.setInterval(tick, 1000);
	}

	// ---------- Tables: a wrap whose table does not fit says so (.scrolls and a hint) ----------

	function markScrolls(root) {
		(root || document).querySelectorAll(".table-wrap").forEach(function (wrap) {
			var scrolls = wrap.scrollWidth > wrap.clientWidth + 1;
			wrap.classList.toggle("scrolls", scrolls);
			var hint = wrap.nextElementSibling;
			var has = hint && hint.classList.contains("scroll-hint");
			if (scrolls && !has) {
				hint = document.createElement("p");
				hint.className = "scroll-hint";
				hint.textContent = "Scroll sideways for more columns →";
				wrap.insertAdjacentElement("afterend", hint);
			} else if (!scrolls && has) {
				hint.remove();
			}
		});
	}
	markScrolls();
	window.addEventListener("resize", function () { markScrolls(); });
	document.addEventListener("htmx:afterSettle", function () { markScrolls(); });

	// ---------- A live log follows its end, unless the reader scrolled up ----------

	var following = {};
	document.addEventListener("htmx:beforeSwap", function () {
		document.querySelectorAll("pre[data-follow]").forEach(function (pre) {
			following[pre.id] = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
		});
	});
	document.addEventListener("htmx:afterSettle", function () {
		document.querySelectorAll("pre[data-follow]").forEach(function (pre) {
			if (following[pre.id] !== false) {
				pre.scrollTop = pre.scrollHeight;
			}
		});
	});
	document.querySelectorAll("pre[data-follow]").forEach(function (pre) {
		pre.scrollTop = pre.scrollHeight;
	});
})();
