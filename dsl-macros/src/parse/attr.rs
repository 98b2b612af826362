//! The `#[kernel(...)]` attribute: `grid = EXPR`, `tunable(NAME = [v, ...], ...)`,
//! `derived(NAME = EXPR, ...)`, `constraint(EXPR, ...)`, `helper`, `helpers(f, g)`.

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{bracketed, parenthesized, Expr, Ident, LitInt, Token};

/// A tunable parameter with its allowed values.
pub struct Tunable {
    /// The name (used as a const generic in the kernel).
    pub name: Ident,
    /// Allowed values, in declaration order.
    pub values: Vec<i64>,
}

/// The parsed attribute.
#[derive(Default)]
pub struct KernelAttr {
    /// Grid expression (1–3 axes), for kernels.
    pub grid: Option<Expr>,
    /// The `grid` key, for errors.
    pub grid_key: Option<Ident>,
    /// The `tunable` keys, for errors.
    pub tunable_keys: Vec<Ident>,
    /// Tunables.
    pub tunables: Vec<Tunable>,
    /// This function is a helper, not a launchable kernel.
    pub helper: bool,
    /// Helper functions this kernel calls.
    pub helpers: Vec<Ident>,
    /// Constants derived from the tunables (`derived(BKH = BK / 2)`), in declaration order.
    pub derived: Vec<(Ident, Expr)>,
    /// Conditions a point of the tunable space must meet to be instantiated
    /// (`constraint(BDV <= BD)`): they prune tile combinations nobody would pick, so the kernel
    /// compiles fewer instances.
    pub constraints: Vec<Expr>,
}

enum Item {
    Grid(Ident, Box<Expr>),
    Tunable(Ident, Vec<Tunable>),
    Helper,
    Derived(Vec<(Ident, Expr)>),
    Constraint(Vec<Expr>),
    Helpers(Vec<Ident>),
}

impl Parse for Item {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let key: Ident = input.parse()?;
        match key.to_string().as_str() {
            "grid" => {
                if !input.peek(Token![=]) {
                    return Err(syn::Error::new(
                        key.span(),
                        "`grid` needs a value: `grid = (cdiv(out.rows(), BM), cdiv(out.cols(), BN))` (1 to 3 axes)",
                    ));
                }
                input.parse::<Token![=]>()?;
                Ok(Item::Grid(key, Box::new(input.parse()?)))
            }
            "tunable" => {
                let content;
                parenthesized!(content in input);
                let list = Punctuated::<TunableDecl, Token![,]>::parse_terminated(&content)?;
                Ok(Item::Tunable(key, list.into_iter().map(|t| t.0).collect()))
            }
            "helper" => Ok(Item::Helper),
            "derived" => {
                let content;
                parenthesized!(content in input);
                let list = Punctuated::<DerivedDecl, Token![,]>::parse_terminated(&content)?;
                Ok(Item::Derived(list.into_iter().map(|d| (d.0, d.1)).collect()))
            }
            "constraint" => {
                let content;
                parenthesized!(content in input);
                let list = Punctuated::<Expr, Token![,]>::parse_terminated(&content)?;
                Ok(Item::Constraint(list.into_iter().collect()))
            }
            "helpers" => {
                let content;
                parenthesized!(content in input);
                let list = Punctuated::<Ident, Token![,]>::parse_terminated(&content)?;
                Ok(Item::Helpers(list.into_iter().collect()))
            }
            other => Err(syn::Error::new(
                key.span(),
                format!(
                    "unknown kernel option `{other}`; expected `grid = (...)`, `tunable(NAME = [values], ...)`, `derived(NAME = TUNABLE / 2, ...)`, `constraint(A <= B, ...)`, `helper` or `helpers(fn, ...)`"
                ),
            )),
        }
    }
}

struct TunableDecl(Tunable);

impl Parse for TunableDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        let s = name.to_string();
        if s.chars().any(|c| c.is_ascii_lowercase()) {
            return Err(syn::Error::new(
                name.span(),
                format!("tunable `{s}` must be an UPPER_CASE name: it becomes a compile-time constant of the kernel"),
            ));
        }
        if !input.peek(Token![=]) || !input.peek2(syn::token::Bracket) {
            return Err(syn::Error::new(
                name.span(),
                format!("tunable `{s}` needs a list of values: `{s} = [32, 64, 128]`"),
            ));
        }
        input.parse::<Token![=]>()?;
        let content;
        let bracket = bracketed!(content in input);
        let mut values = Vec::new();
        while !content.is_empty() {
            let e: Expr = content.parse()?;
            match &e {
                Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(li),
                    ..
                }) => {
                    let v = parse_positive(li, &s)?;
                    if values.contains(&v) {
                        return Err(syn::Error::new(
                            li.span(),
                            format!("value {v} is listed twice for tunable `{s}`; list each value once"),
                        ));
                    }
                    values.push(v);
                }
                _ => return Err(syn::Error::new_spanned(
                    &e,
                    format!(
                        "tunable `{s}` values must be positive integer literals (tile sizes), e.g. `{s} = [32, 64, 128]`"
                    ),
                )),
            }
            if content.is_empty() {
                break;
            }
            content.parse::<Token![,]>()?;
        }
        if values.is_empty() {
            return Err(syn::Error::new(
                bracket.span.join(),
                format!("tunable `{s}` lists no values; give at least one, e.g. `{s} = [64]`"),
            ));
        }
        Ok(TunableDecl(Tunable { name, values }))
    }
}

fn parse_positive(li: &LitInt, name: &str) -> syn::Result<i64> {
    let v: i64 = li.base10_parse()?;
    if v <= 0 {
        return Err(syn::Error::new(
            li.span(),
            format!("tunable `{name}` = {v}: tunable values are tile sizes and must be positive, e.g. `{name} = [32, 64, 128]`"),
        ));
    }
    if !matches!(li.suffix(), "" | "usize") {
        return Err(syn::Error::new(
            li.span(),
            format!(
                "tunable values are `usize` tile sizes; write `{v}` without the `{}` suffix",
                li.suffix()
            ),
        ));
    }
    Ok(v)
}

impl Parse for KernelAttr {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let items = Punctuated::<Item, Token![,]>::parse_terminated(input)?;
        let mut out = KernelAttr::default();
        for item in items {
            match item {
                Item::Grid(key, e) => {
                    if out.grid_key.is_some() {
                        return Err(syn::Error::new(
                            key.span(),
                            "`grid` is given twice; a kernel has one grid of 1 to 3 axes: `grid = (x, y)`",
                        ));
                    }
                    out.grid = Some(*e);
                    out.grid_key = Some(key);
                }
                Item::Tunable(key, t) => {
                    for new in t {
                        if out.tunables.iter().any(|o| o.name == new.name) {
                            return Err(syn::Error::new(
                                new.name.span(),
                                format!(
                                    "tunable `{0}` is declared twice; declare it once with all its values: `{0} = [..]`",
                                    new.name
                                ),
                            ));
                        }
                        out.tunables.push(new);
                    }
                    out.tunable_keys.push(key);
                }
                Item::Helper => out.helper = true,
                Item::Derived(d) => {
                    for (name, _) in &d {
                        if out.tunables.iter().any(|t| t.name == *name)
                            || out.derived.iter().any(|(n, _)| n == name)
                        {
                            return Err(syn::Error::new(
                                name.span(),
                                format!(
                                    "`{name}` is declared twice (as a tunable or derived constant)"
                                ),
                            ));
                        }
                    }
                    out.derived.extend(d);
                }
                Item::Constraint(c) => out.constraints.extend(c),
                Item::Helpers(h) => out.helpers.extend(h),
            }
        }
        if out.helper {
            let keys = out.grid_key.iter().chain(&out.tunable_keys);
            let mut errs = keys.map(|k| {
                syn::Error::new(
                    k.span(),
                    format!(
                        "a `helper` has no `{k}` of its own: it runs inside the calling kernel's program and takes the kernel's constants as const generics (`fn h<const R: usize>(..)`)"
                    ),
                )
            });
            if let Some(mut first) = errs.next() {
                for e in errs {
                    first.combine(e);
                }
                return Err(first);
            }
        }
        Ok(out)
    }
}

/// `NAME = <integer expression over tunables>`.
struct DerivedDecl(Ident, Expr);

impl Parse for DerivedDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        if name.to_string().chars().any(|c| c.is_ascii_lowercase()) {
            return Err(syn::Error::new(
                name.span(),
                format!("derived constant `{name}` must be an UPPER_CASE name: it becomes a compile-time constant of the kernel"),
            ));
        }
        input.parse::<Token![=]>()?;
        Ok(DerivedDecl(name, input.parse()?))
    }
}
