//! The little XML the JUnit writer needs: an element tree shaped like
//! Python's `xml.etree.ElementTree` (text before the first child, a tail
//! after each element), written byte for byte as ElementTree writes it
//! (`ET.indent` then `write(encoding="utf-8", xml_declaration=True)`), and
//! a small parser for the JUnit files `--merge` takes. The writer matching
//! ElementTree is what lets the removed scripts/junit.py be checked against
//! this one on the same logs; the parser only has to read JUnit files
//! (elements, attributes, text, CDATA; comments, processing instructions and
//! a DOCTYPE are skipped), so no XML crate is pulled in for it.

use thiserror::Error;

/// One element: ElementTree's `tag`, `attrib` (in insertion order), `text`
/// and `tail` (an empty string where ElementTree has `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Element {
    /// The tag name.
    pub tag: String,
    /// The attributes, in the order they were set.
    pub attrs: Vec<(String, String)>,
    /// The text before the first child.
    pub text: String,
    /// The text after this element's end tag, before the next sibling.
    pub tail: String,
    /// The child elements.
    pub children: Vec<Element>,
}

impl Element {
    /// An element without attributes, text or children.
    pub fn new(tag: &str) -> Self {
        Element {
            tag: tag.into(),
            ..Default::default()
        }
    }

    /// Sets an attribute (replacing its value, keeping its place, as
    /// ElementTree's `set` does).
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.attrs.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value,
            None => self.attrs.push((key.into(), value)),
        }
    }

    /// An attribute's value.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The first direct child with this tag (ElementTree's `find(tag)`).
    pub fn find(&self, tag: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.tag == tag)
    }

    /// This element and its descendants with this tag, in document order
    /// (ElementTree's `iter(tag)`).
    pub fn iter_tag<'a>(&'a self, tag: &str, out: &mut Vec<&'a Element>) {
        if self.tag == tag {
            out.push(self);
        }
        for c in &self.children {
            c.iter_tag(tag, out);
        }
    }

    /// ElementTree's `indent(elem, "  ")`: whitespace-only text and tails of
    /// elements with children become newlines plus two spaces per level;
    /// leaves keep their text.
    pub fn indent(&mut self) {
        if !self.children.is_empty() {
            indent_children(self, 0);
        }
    }

    /// The document as ElementTree writes it with `encoding="utf-8",
    /// xml_declaration=True`: the declaration, a newline, the element, no
    /// newline at the end.
    pub fn to_document(&self) -> String {
        let mut out = String::from("<?xml version='1.0' encoding='utf-8'?>\n");
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        out.push('<');
        out.push_str(&self.tag);
        for (k, v) in &self.attrs {
            out.push(' ');
            out.push_str(k);
            out.push_str("=\"");
            out.push_str(&escape_attr(v));
            out.push('"');
        }
        if self.text.is_empty() && self.children.is_empty() {
            out.push_str(" />");
        } else {
            out.push('>');
            out.push_str(&escape_text(&self.text));
            for c in &self.children {
                c.write(out);
            }
            out.push_str("</");
            out.push_str(&self.tag);
            out.push('>');
        }
        out.push_str(&escape_text(&self.tail));
    }
}

fn blank(s: &str) -> bool {
    crate::pytext::strip(s).is_empty()
}

fn indent_children(e: &mut Element, level: usize) {
    let child_indent = format!("\n{}", "  ".repeat(level + 1));
    if blank(&e.text) {
        e.text = child_indent.clone();
    }
    for c in e.children.iter_mut() {
        if !c.children.is_empty() {
            indent_children(c, level + 1);
        }
        if blank(&c.tail) {
            c.tail = child_indent.clone();
        }
    }
    // the last child's tail closes the parent at the parent's own level
    if let Some(last) = e.children.last_mut() {
        if blank(&last.tail) {
            last.tail = format!("\n{}", "  ".repeat(level));
        }
    }
}

/// ElementTree's `_escape_cdata`: text escapes only `&`, `<` and `>`.
fn escape_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// ElementTree's `_escape_attrib`: also `"`, and CR, LF and tab as character
/// references (so a reader's attribute normalisation keeps them).
fn escape_attr(s: &str) -> String {
    escape_text(s)
        .replace('"', "&quot;")
        .replace('\r', "&#13;")
        .replace('\n', "&#10;")
        .replace('\t', "&#09;")
}

/// Why a document could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{what}: line {line}, column {column}")]
pub struct ParseError {
    /// 1-based line of the problem.
    pub line: usize,
    /// 0-based column (in characters), as expat counts it.
    pub column: usize,
    /// What was wrong.
    pub what: String,
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

/// Parses a document into its root element (line ends normalised to `\n`,
/// entities and character references resolved, literal whitespace in
/// attribute values turned into spaces, as an XML parser must).
pub fn parse(doc: &str) -> Result<Element, ParseError> {
    let norm = doc.replace("\r\n", "\n").replace('\r', "\n");
    let mut p = Parser { s: &norm, pos: 0 };
    p.eat("\u{feff}");
    p.misc()?;
    if !p.rest().starts_with('<') {
        return Err(p.err(if p.rest().is_empty() {
            "no element found"
        } else {
            "syntax error"
        }));
    }
    let root = p.element()?;
    p.misc()?;
    if !p.rest().is_empty() {
        return Err(p.err("junk after document element"));
    }
    Ok(root)
}

impl<'a> Parser<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    fn err(&self, what: &str) -> ParseError {
        let before = &self.s[..self.pos];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count());
        ParseError {
            line,
            column,
            what: what.into(),
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.rest().starts_with(lit) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn skip_ws(&mut self) {
        let r = self.rest();
        self.pos += r.len() - r.trim_start_matches([' ', '\t', '\n']).len();
    }

    /// Skips up to and past `end`.
    fn skip_past(&mut self, end: &str) -> Result<(), ParseError> {
        match self.rest().find(end) {
            Some(i) => {
                self.pos += i + end.len();
                Ok(())
            }
            None => {
                self.pos = self.s.len();
                Err(self.err("unclosed token"))
            }
        }
    }

    /// Whitespace, comments, processing instructions and a DOCTYPE outside
    /// the root element.
    fn misc(&mut self) -> Result<(), ParseError> {
        loop {
            self.skip_ws();
            if self.eat("<!--") {
                self.skip_past("-->")?;
            } else if self.eat("<?") {
                self.skip_past("?>")?;
            } else if self.eat("<!DOCTYPE") {
                self.skip_past(">")?;
            } else {
                return Ok(());
            }
        }
    }

    fn name(&mut self) -> Result<String, ParseError> {
        let r = self.rest();
        let n = r
            .find(|c: char| c.is_whitespace() || matches!(c, '=' | '>' | '/' | '<' | '"' | '\''))
            .unwrap_or(r.len());
        if n == 0 {
            return Err(self.err("not well-formed (invalid token)"));
        }
        self.pos += n;
        Ok(r[..n].to_string())
    }

    /// Resolves the references in `raw` (text or an attribute value).
    fn unescape(&self, raw: &str, attr: bool) -> Result<String, ParseError> {
        let mut out = String::with_capacity(raw.len());
        let mut rest = raw;
        while let Some(i) = rest.find('&') {
            push_literal(&mut out, &rest[..i], attr);
            let after = &rest[i + 1..];
            let Some(end) = after.find(';') else {
                return Err(self.err("not well-formed (invalid token)"));
            };
            let ent = &after[..end];
            let c = match ent {
                "lt" => Some('<'),
                "gt" => Some('>'),
                "amp" => Some('&'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                _ => ent
                    .strip_prefix("#x")
                    .map(|h| u32::from_str_radix(h, 16))
                    .or_else(|| ent.strip_prefix('#').map(|d| d.parse::<u32>()))
                    .and_then(Result::ok)
                    .and_then(char::from_u32),
            };
            match c {
                Some(c) => out.push(c),
                None => return Err(self.err(&format!("undefined entity &{ent};"))),
            }
            rest = &after[end + 1..];
        }
        push_literal(&mut out, rest, attr);
        Ok(out)
    }

    fn element(&mut self) -> Result<Element, ParseError> {
        self.eat("<");
        let mut e = Element::new(&self.name()?);
        loop {
            self.skip_ws();
            if self.eat("/>") {
                return Ok(e);
            }
            if self.eat(">") {
                break;
            }
            let key = self.name()?;
            self.skip_ws();
            if !self.eat("=") {
                return Err(self.err("not well-formed (invalid token)"));
            }
            self.skip_ws();
            let Some(q) = self
                .rest()
                .chars()
                .next()
                .filter(|c| matches!(c, '"' | '\''))
            else {
                return Err(self.err("not well-formed (invalid token)"));
            };
            self.pos += 1;
            let Some(end) = self.rest().find(q) else {
                return Err(self.err("unclosed token"));
            };
            let raw = &self.rest()[..end];
            if raw.contains('<') {
                return Err(self.err("not well-formed (invalid token)"));
            }
            let v = self.unescape(raw, true)?;
            self.pos += end + 1;
            if e.get(&key).is_some() {
                return Err(self.err("duplicate attribute"));
            }
            e.attrs.push((key, v));
        }
        // content: text goes to the element's text before the first child,
        // to the last child's tail after it
        let mut buf = String::new();
        loop {
            let r = self.rest();
            if r.is_empty() {
                return Err(self.err("no element found"));
            }
            let lt = r.find('<').unwrap_or(r.len());
            if lt > 0 {
                buf.push_str(&self.unescape(&r[..lt], false)?);
                self.pos += lt;
                continue;
            }
            if self.eat("<!--") {
                self.skip_past("-->")?;
            } else if self.eat("<![CDATA[") {
                let start = self.pos;
                self.skip_past("]]>")?;
                buf.push_str(&self.s[start..self.pos - 3]);
            } else if self.eat("<?") {
                self.skip_past("?>")?;
            } else if self.eat("</") {
                let name = self.name()?;
                if name != e.tag {
                    return Err(self.err("mismatched tag"));
                }
                self.skip_ws();
                if !self.eat(">") {
                    return Err(self.err("not well-formed (invalid token)"));
                }
                flush(&mut e, &mut buf);
                return Ok(e);
            } else {
                flush(&mut e, &mut buf);
                let child = self.element()?;
                e.children.push(child);
            }
        }
    }
}

/// Literal text; in an attribute value a literal tab or newline is a space.
fn push_literal(out: &mut String, s: &str, attr: bool) {
    if attr {
        out.extend(
            s.chars()
                .map(|c| if matches!(c, '\t' | '\n') { ' ' } else { c }),
        );
    } else {
        out.push_str(s);
    }
}

fn flush(e: &mut Element, buf: &mut String) {
    let data = std::mem::take(buf);
    match e.children.last_mut() {
        Some(last) => last.tail.push_str(&data),
        None => e.text.push_str(&data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_as_elementtree_does() {
        let mut root = Element::new("a");
        root.set("n", "x&\"<\n\t\r");
        let mut b = Element::new("b");
        b.text = "t<&>".into();
        root.children.push(b);
        root.children.push(Element::new("c"));
        root.indent();
        assert_eq!(
            root.to_document(),
            "<?xml version='1.0' encoding='utf-8'?>\n<a n=\"x&amp;&quot;&lt;&#10;&#09;&#13;\">\n  \
             <b>t&lt;&amp;&gt;</b>\n  <c />\n</a>"
        );
    }

    #[test]
    fn parses_what_it_writes() {
        let doc = "<?xml version='1.0'?>\n<!-- c --><r a=\"1&#10;2\n3\"><s>x&amp;y<![CDATA[<z>]]></s>tail<t/></r>\n";
        let r = parse(doc).expect("well-formed");
        assert_eq!(r.get("a"), Some("1\n2 3"));
        assert_eq!(r.children[0].text, "x&y<z>");
        assert_eq!(r.children[0].tail, "tail");
        assert_eq!(r.children[1].tag, "t");
    }

    #[test]
    fn refuses_broken_documents() {
        for bad in [
            "",
            "<a>",
            "<a></b>",
            "<a x=1/>",
            "<a/><b/>",
            "<a>&nope;</a>",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
