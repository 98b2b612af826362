//! Body rewriting: every intrinsic or helper call gets the execution context and its source line.

use crate::intrinsics;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Expr, GenericArgument, Ident, PathArguments};

/// Rewrites `block` in place; returns the (line, code) of each line that issues instructions.
///
/// In a kernel each call sets the context's line to its own (`__ctx.at(line)`). In a helper
/// (`in_helper`) calls pass the context on unchanged, so everything a helper issues is attributed
/// to the kernel line that called it: the kernel's `META.lines` (and its report) cover every cycle,
/// wherever the helper is defined.
pub fn rewrite_body(
    block: &mut syn::Block,
    helpers: &[Ident],
    in_helper: bool,
) -> Vec<(u32, String)> {
    let mut r = Rewriter {
        helpers,
        in_helper,
        lines: Vec::new(),
        stmt_text: String::new(),
    };
    r.visit_block_mut(block);
    r.lines.sort_by_key(|(l, _)| *l);
    r.lines.dedup_by_key(|(l, _)| *l);
    r.lines
}

struct Rewriter<'a> {
    helpers: &'a [Ident],
    in_helper: bool,
    lines: Vec<(u32, String)>,
    stmt_text: String,
}

fn line_of(span: Span) -> u32 {
    span.start().line as u32
}

impl VisitMut for Rewriter<'_> {
    fn visit_stmt_mut(&mut self, s: &mut syn::Stmt) {
        let saved = std::mem::replace(&mut self.stmt_text, stmt_text(s));
        visit_mut::visit_stmt_mut(self, s);
        self.stmt_text = saved;
    }

    fn visit_expr_mut(&mut self, e: &mut Expr) {
        // Rewrite inner calls first (arguments may themselves be intrinsic calls).
        visit_mut::visit_expr_mut(self, e);
        let Expr::Call(call) = e else { return };
        let Expr::Path(p) = &*call.func else { return };
        if p.path.segments.len() != 1 || p.qself.is_some() {
            return;
        }
        let seg = &p.path.segments[0];
        let name = seg.ident.to_string();
        let span = call.func.span();
        let line = line_of(span);
        let args = &call.args;
        if let Some(intr) = intrinsics::find(&name) {
            let ident = &seg.ident;
            if !intr.takes_ctx {
                *e = syn::parse2(quote_spanned!(span=> ::dsl_core::intrinsics::#ident(#args)))
                    .expect("valid call");
                return;
            }
            // Complete the turbofish with `_` for the generics the author does not write.
            let mut given: Vec<TokenStream> = match &seg.arguments {
                PathArguments::AngleBracketed(ab) => ab
                    .args
                    .iter()
                    .map(GenericArgument::to_token_stream)
                    .collect(),
                _ => Vec::new(),
            };
            // Spanned at the call, like everything generated here: a type error in the call then
            // points at the author's code, not at the `#[kernel]` attribute.
            while given.len() < intr.generics {
                given.push(quote_spanned!(span=> _));
            }
            let turbofish = if given.is_empty() {
                quote!()
            } else {
                quote_spanned!(span=> ::<#(#given),*>)
            };
            let ctx = self.ctx_arg(span, line);
            // Arguments that issue instructions themselves are evaluated first (see `hoist`).
            let (binds, args) = hoist(args);
            *e = wrap(
                &binds,
                quote_spanned!(span=> ::dsl_core::intrinsics::#ident #turbofish(#ctx, #(#args),*)),
                span,
            );
        } else if self.helpers.contains(&seg.ident) {
            let ctx = self.ctx_arg(span, line);
            let func = &call.func;
            let (binds, args) = hoist(args);
            *e = wrap(&binds, quote_spanned!(span=> #func(#ctx, #(#args),*)), span);
        }
    }
}

/// Arguments that use the context (they contain intrinsic or helper calls) are evaluated into
/// locals before the call: the call borrows the context mutably for its first argument, so they
/// cannot be evaluated after it. Every other argument stays in place, keeping its span: a type
/// error (say, `mma` of tiles whose shapes disagree) points at the author's argument.
fn hoist(
    args: &syn::punctuated::Punctuated<Expr, syn::Token![,]>,
) -> (Vec<TokenStream>, Vec<TokenStream>) {
    let mut binds = Vec::new();
    let mut passed = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if uses_ctx(a.to_token_stream()) {
            let name = Ident::new(&format!("__arg{i}"), a.span());
            binds.push(quote_spanned!(a.span()=> let #name = #a;));
            passed.push(name.into_token_stream());
        } else {
            passed.push(a.to_token_stream());
        }
    }
    (binds, passed)
}

/// `call`, or `{ binds; call }` when arguments were hoisted.
fn wrap(binds: &[TokenStream], call: TokenStream, span: Span) -> Expr {
    let tokens = if binds.is_empty() {
        call
    } else {
        quote_spanned!(span=> { #(#binds)* #call })
    };
    syn::parse2(tokens).expect("valid call")
}

/// Whether `ts` mentions the execution context (i.e. contains a rewritten call).
fn uses_ctx(ts: TokenStream) -> bool {
    ts.into_iter().any(|tt| match tt {
        proc_macro2::TokenTree::Ident(i) => i == "__ctx",
        proc_macro2::TokenTree::Group(g) => uses_ctx(g.stream()),
        _ => false,
    })
}

impl Rewriter<'_> {
    /// The context argument of a call on `line`: in a kernel, the context moved to that line
    /// (and the line recorded); in a helper, the context as it is (the calling kernel line).
    fn ctx_arg(&mut self, span: Span, line: u32) -> TokenStream {
        if self.in_helper {
            quote_spanned!(span=> &mut *__ctx)
        } else {
            self.lines.push((line, self.stmt_text.clone()));
            quote_spanned!(span=> __ctx.at(#line))
        }
    }
}

/// A readable one-line rendering of a statement (a loop or `if` is shown up to its body).
fn stmt_text(s: &syn::Stmt) -> String {
    let head: TokenStream = match s {
        syn::Stmt::Expr(Expr::ForLoop(f), _) => {
            let (pat, expr) = (&f.pat, &f.expr);
            quote!(for #pat in #expr)
        }
        syn::Stmt::Expr(Expr::If(i), _) => {
            let c = &i.cond;
            quote!(if #c)
        }
        other => other.to_token_stream(),
    };
    tidy(&head.to_string())
}

/// Removes the spaces `TokenStream::to_string` puts around punctuation.
fn tidy(s: &str) -> String {
    // One line: the compiler's rendering of a long statement may contain line breaks.
    let mut out = s.split_whitespace().collect::<Vec<_>>().join(" ");
    for (from, to) in [
        (" :: ", "::"),
        (":: <", "::<"),
        ("::< ", "::<"),
        (" ,", ","),
        (" ;", ";"),
        (" . ", "."),
        (" .", "."),
        ("( ", "("),
        (" )", ")"),
        ("[ ", "["),
        (" ]", "]"),
        ("& ", "&"),
        ("! ", "!"),
        (" (", "("),
        (".. ", ".."),
    ] {
        out = out.replace(from, to);
    }
    // Closing the turbofish: `BK >(` → `BK>(`.
    out = out.replace(" >(", ">(").replace(" > (", ">(");
    // A call's `(` hugs the callee, but a keyword or operator keeps its space (`let (a, b)`,
    // `for x in (0..n)`, `a * (b + c)`, `f(a, (b, c))`).
    space_before_paren(&out)
}

/// Puts back the space `tidy` removed before a `(` that does not open a call's arguments.
fn space_before_paren(s: &str) -> String {
    const KEYWORDS: &[&str] = &[
        "as", "else", "for", "if", "in", "let", "loop", "match", "move", "mut", "ref", "return",
        "while",
    ];
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        if c == '(' && i > 0 {
            let prev = chars[i - 1];
            let ident = |c: char| c.is_alphanumeric() || c == '_';
            let needs_space = if ident(prev) {
                let start = chars[..i]
                    .iter()
                    .rposition(|c| !ident(*c))
                    .map_or(0, |p| p + 1);
                let word: String = chars[start..i].iter().collect();
                KEYWORDS.contains(&word.as_str())
            } else {
                // Operators and separators (`=`, `+`, `*`, `,`, ...) but not `>` (a turbofish or
                // generic call), `)`/`]` (a call of a call or of an index), `!` (a macro), `(`/`[`,
                // `&` (a reference to a parenthesised value reads fine either way), `.`, `:` or `<`.
                !matches!(
                    prev,
                    '>' | ')' | ']' | '!' | '(' | '[' | '&' | '.' | ':' | '<' | ' '
                )
            };
            if needs_space {
                out.push(' ');
            }
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::tidy;

    #[test]
    fn tidy_keeps_keyword_spaces_and_hugs_calls() {
        let cases = [
            (
                "let (r , c) = (program_id (0) * BR , program_id (1) * BC) ;",
                "let (r, c) = (program_id(0) * BR, program_id(1) * BC);",
            ),
            (
                "let b = x . rows () . min (16) ;",
                "let b = x.rows().min(16);",
            ),
            (
                "for k in (0 .. a . cols ()) . step_by (BK)",
                "for k in (0..a.cols()).step_by(BK)",
            ),
            (
                "let t = load :: < BM , BK > (a , row , k) ;",
                "let t = load::<BM, BK>(a, row, k);",
            ),
            (
                "store (c , row , col , & acc) ;",
                "store(c, row, col, &acc);",
            ),
            ("let v = a * (b + c) ;", "let v = a * (b + c);"),
            ("f (a , (b , c))", "f(a, (b, c))"),
            ("if (a < b)", "if (a < b)"),
            (
                "store (y , r , 0 , &\nadd (& s , & t) ,) ;",
                "store(y, r, 0, &add(&s, &t),);",
            ),
            (
                "let y = cast :: < f32 > (& load :: < BR , BH > (x , r , 0)) ;",
                "let y = cast::<f32>(&load::<BR, BH>(x, r, 0));",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(tidy(input), want, "tidy({input:?})");
        }
    }
}
