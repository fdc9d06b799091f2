"""How the HTML reader finds a page's main content: the element the page names, several of them,
a title outside it, and a main element too small to trust (real pages written in tmp strings)."""

from __future__ import annotations

from residency.corpus.html import read_html

LOREM = " ".join(["The keeper trims the wick and logs the hour before dusk."] * 12)


def test_a_front_page_with_one_article_per_post_keeps_every_post() -> None:
    posts = "".join(
        f"<article><h2>Post {n}</h2><p>Body of post {n}.</p></article>" for n in range(4)
    )
    page = f"<html><body><nav>Home About</nav><div id='posts'>{posts}</div></body></html>"
    drafts, _ = read_html("blog.html", page.encode())
    assert [(d.title, d.text) for d in drafts] == [
        (f"Post {n}", f"Body of post {n}.") for n in range(4)
    ]


def test_a_title_above_the_main_element_is_kept() -> None:
    page = (
        "<html><body><header><h1 id='post-title'>Winter storms</h1></header>"
        f"<main><p>{LOREM}</p><h2>Damage</h2><p>Two panes broke.</p></main></body></html>"
    )
    drafts, _ = read_html("post.html", page.encode())
    assert [(d.id, d.title) for d in drafts] == [
        ("post.html#post-title", "Winter storms"),
        ("post.html#damage", "Winter storms > Damage"),
    ]


def test_a_banner_marked_main_is_checked_against_the_page() -> None:
    article = "".join(f"<p>{LOREM} Paragraph {n}.</p>" for n in range(6))
    page = (
        "<html><body><main><p>Subscribe now</p></main>"
        f"<div class='content'><h1>Fog signals</h1>{article}</div></body></html>"
    )
    drafts, _ = read_html("page.html", page.encode())
    text = "\n".join(d.text for d in drafts)
    assert "Paragraph 5." in text
    assert "Fog signals" in {d.title for d in drafts}


def test_an_empty_main_element_is_skipped_with_the_reason() -> None:
    page = "<html><body><nav>Docs Search</nav><main><div id='results'></div></main></body></html>"
    drafts, skipped = read_html("search.html", page.encode())
    assert drafts == []
    assert [s.reason for s in skipped] == [
        "no text in the page's main element (filled in by JavaScript?)"
    ]


def test_code_keeps_its_comments_and_a_docs_page_drops_its_contents_box() -> None:
    page = (
        "<html><body><main><article><h1>Setup<a class='hash-link' href='#setup'>\u200b</a></h1>"
        "<pre><code><span class='token comment'># install first</span>\npip install x"
        "</code></pre></article><div class='col'><ul class='table-of-contents'>"
        "<li><a href='#setup'>Setup</a></li></ul></div></main></body></html>"
    )
    drafts, _ = read_html("docs.html", page.encode())
    assert [(d.title, d.text) for d in drafts] == [("Setup", "# install first\npip install x")]


def test_a_blog_post_marked_with_microformats_is_the_main_content() -> None:
    page = (
        "<html><body><div class='sidebar-wrap'><h2>Archive</h2><p>2016 2015</p></div>"
        "<div class='post hentry'><h3 class='post-title'>Release 3.6.0</h3>"
        f"<div class='post-body entry-content'><p>{LOREM}</p></div></div></body></html>"
    )
    drafts, _ = read_html("blog.html", page.encode())
    assert [d.title for d in drafts] == ["Release 3.6.0"]
    assert "Archive" not in drafts[0].text
