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
})();
