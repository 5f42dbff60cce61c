#!/usr/bin/env python3
"""Checks the links of a built mdBook without the network: every relative
href/src in every HTML page must name a file of the build, and every
#fragment must be an id in the page it points to. External links
(http:, https:, mailto:) are listed but not fetched.

Usage: book/tools/check-links.py BUILD_DIR   (exit 1 on a broken link)
"""
import html.parser
import os
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if value and ((name == "href" and tag in ("a", "link")) or (name == "src" and tag in ("img", "script"))):
                self.links.append(value)


def parse(path, cache):
    if path not in cache:
        page = Page()
        with open(path, encoding="utf-8", errors="replace") as f:
            page.feed(f.read())
        cache[path] = page
    return cache[path]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[1])
    cache, broken, external, checked = {}, [], set(), 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".html"):
                continue
            path = os.path.join(dirpath, name)
            if os.path.basename(path) in ("print.html", "toc.html", "404.html"):
                continue  # copies of the pages, checked where they come from
            for link in parse(path, cache).links:
                url = urllib.parse.urlsplit(link)
                if url.scheme in ("http", "https", "mailto"):
                    external.add(link)
                    continue
                if url.scheme or link.startswith("//") or link.startswith("javascript:"):
                    continue
                checked += 1
                target = path if not url.path else os.path.normpath(
                    os.path.join(os.path.dirname(path), urllib.parse.unquote(url.path)))
                if os.path.isdir(target):
                    target = os.path.join(target, "index.html")
                rel = os.path.relpath(path, root)
                if not os.path.isfile(target):
                    broken.append(f"{rel}: {link} (no file {os.path.relpath(target, root)})")
                elif url.fragment and target.endswith(".html"):
                    if urllib.parse.unquote(url.fragment) not in parse(target, cache).ids:
                        broken.append(f"{rel}: {link} (no id #{url.fragment})")
    for link in sorted(external):
        print(f"external (not fetched): {link}")
    for b in broken:
        print(f"BROKEN: {b}")
    print(f"{checked} relative links checked, {len(broken)} broken, {len(external)} external")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
