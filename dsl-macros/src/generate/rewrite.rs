//! Body rewriting: every intrinsic or helper call gets the execution context and its source line.

use crate::intrinsics;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Expr, GenericArgument, Ident, PathArguments};

/// Rewrites `block` in place; returns the (line, code) of each line that issues instructions.
pub fn rewrite_body(block: &mut syn::Block, helpers: &[Ident]) -> Vec<(u32, String)> {
    let mut r = Rewriter {
        helpers,
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
            while given.len() < intr.generics {
                given.push(quote!(_));
            }
            let turbofish = if given.is_empty() {
                quote!()
            } else {
                quote!(::<#(#given),*>)
            };
            let text = self.code_for(line);
            self.lines.push((line, text));
            // Arguments are evaluated into locals first: they may be intrinsic calls themselves, and
            // each needs the context mutably.
            let (binds, names) = hoist(args);
            *e = syn::parse2(quote_spanned!(span=> { #(#binds)* ::dsl_core::intrinsics::#ident #turbofish(__ctx.at(#line), #(#names),*) }))
                .expect("valid call");
        } else if self.helpers.iter().any(|h| *h == seg.ident) {
            let text = self.code_for(line);
            self.lines.push((line, text));
            let func = &call.func;
            let (binds, names) = hoist(args);
            *e = syn::parse2(
                quote_spanned!(span=> { #(#binds)* #func(__ctx.at(#line), #(#names),*) }),
            )
            .expect("valid call");
        }
    }
}

/// `let __argN = <arg>;` for each argument, and the names to pass.
fn hoist(
    args: &syn::punctuated::Punctuated<Expr, syn::Token![,]>,
) -> (Vec<TokenStream>, Vec<Ident>) {
    let mut binds = Vec::new();
    let mut names = Vec::new();
    for (i, a) in args.iter().enumerate() {
        let name = Ident::new(&format!("__arg{i}"), Span::call_site());
        binds.push(quote_spanned!(a.span()=> let #name = #a;));
        names.push(name);
    }
    (binds, names)
}

impl Rewriter<'_> {
    fn code_for(&self, _line: u32) -> String {
        self.stmt_text.clone()
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
    let mut out = s.to_string();
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
    ] {
        out = out.replace(from, to);
    }
    // Closing the turbofish: `BK >(` → `BK>(`.
    out = out.replace(" >(", ">(").replace(" > (", ">(");
    for kw in [
        "in(", "if(", "for(", "=(", "+(", "*(", "-(", "/(", "return(",
    ] {
        let fixed = format!("{} (", &kw[..kw.len() - 1]);
        out = out.replace(kw, &fixed);
    }
    out
}
