// Berth theme: runs in <head> before the first paint (not deferred), so a chosen theme never
// flashes the other one. "light" or "dark" in localStorage pins it (data-theme on <html>, which
// app.css reads); nothing stored follows the system's prefers-color-scheme. The toggle is in
// app.js. The "js" class tells the stylesheet that scripts run (menus may start closed).
(function () {
	"use strict";
	var root = document.documentElement;
	root.classList.add("js");
	try {
		var theme = window.localStorage.getItem("berth-theme");
		if (theme === "light" || theme === "dark") {
			root.setAttribute("data-theme", theme);
		}
	} catch (e) {
		// Storage may be off (private mode, policies): follow the system.
	}
})();
