//! Checks that a kernel body stays inside the DSL subset. Every error points at the offending
//! span and says what is allowed instead.

use crate::intrinsics::{self, METHODS, PRIMITIVES};
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{
    Expr, ExprCall, ExprForLoop, ExprMethodCall, GenericArgument, Ident, ItemFn, PathArguments,
    Type,
};

/// Validates the signature and body; returns every error found.
pub fn validate(
    f: &ItemFn,
    helpers: &[Ident],
    tunables: &[String],
    is_helper: bool,
) -> Vec<syn::Error> {
    let mut v = Validator {
        errors: Vec::new(),
        helpers,
        tunables,
        closures: Vec::new(),
    };
    let sig = &f.sig;
    if let Some(a) = &sig.asyncness {
        v.err(
            a.span(),
            "kernels cannot be `async`: a program runs to completion on its core",
        );
    }
    if let Some(u) = &sig.unsafety {
        v.err(
            u.span(),
            "kernels cannot be `unsafe`: device memory is reached only through intrinsics",
        );
    }
    if !is_helper {
        if let syn::ReturnType::Type(_, ty) = &sig.output {
            v.err(
                ty.span(),
                "a kernel returns nothing: write results to an output tensor with `store`",
            );
        }
    }
    if !is_helper {
        for g in &sig.generics.params {
            if let syn::GenericParam::Const(c) = g {
                let n = &c.ident;
                v.err(
                    n.span(),
                    format!(
                        "a kernel cannot have a const generic of its own: `launch` has no way to choose `{n}`; \
                         declare it as a tunable instead: `#[kernel(tunable({n} = [64, 128]), ..)]` (helpers may take const generics)"
                    ),
                );
            }
        }
    }
    for input in &sig.inputs {
        match input {
            syn::FnArg::Receiver(r) => v.err(
                r.span(),
                "kernels are free functions; `self` parameters are not allowed",
            ),
            syn::FnArg::Typed(pt) => {
                match &*pt.pat {
                    syn::Pat::Ident(pi) if pi.ident.to_string().starts_with("__") => v.err(
                        pi.ident.span(),
                        format!(
                            "`{}`: names starting with `__` are reserved for the code `#[kernel]` generates; rename the parameter",
                            pi.ident
                        ),
                    ),
                    syn::Pat::Ident(_) => {}
                    _ => v.err(
                        pt.pat.span(),
                        "kernel parameters must be plain names (`x: &Tensor<f32>`), not patterns",
                    ),
                }
            }
        }
    }
    v.visit_block(&f.block);
    v.errors
}

struct Validator<'a> {
    errors: Vec<syn::Error>,
    helpers: &'a [Ident],
    tunables: &'a [String],
    /// Local names bound to a closure (already reported; calls to them are not reported again).
    closures: Vec<Ident>,
}

impl Validator<'_> {
    fn err(&mut self, span: proc_macro2::Span, msg: impl Into<String>) {
        self.errors.push(syn::Error::new(span, msg.into()));
    }

    fn check_shape_args(&mut self, seg: &syn::PathSegment, intr: &intrinsics::Intrinsic) {
        let shape_args = &intr.shape_args;
        let PathArguments::AngleBracketed(ab) = &seg.arguments else {
            return;
        };
        for (idx, arg) in ab.args.iter().enumerate() {
            if intr.type_args.contains(&idx) {
                let shape_like = match arg {
                    GenericArgument::Const(_) => true,
                    GenericArgument::Type(Type::Path(tp)) => tp
                        .path
                        .get_ident()
                        .is_some_and(|i| self.tunables.iter().any(|t| i == t)),
                    _ => false,
                };
                if shape_like {
                    self.err(
                        arg.span(),
                        format!(
                            "this generic argument of `{}` is the element type (`f32`, `bf16`, `f16` or a type parameter), not a tile size: write `{}`",
                            intr.name, intr.usage
                        ),
                    );
                }
                continue;
            }
            if !shape_args.contains(&idx) {
                continue;
            }
            let ok = match arg {
                // Left to inference, which only ever finds a constant.
                GenericArgument::Type(Type::Infer(_)) => true,
                GenericArgument::Const(Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(_),
                    ..
                })) => true,
                GenericArgument::Type(Type::Path(tp))
                    if tp.qself.is_none() && tp.path.segments.len() == 1 =>
                {
                    let name = tp.path.segments[0].ident.to_string();
                    !name.chars().any(|c| c.is_ascii_lowercase())
                }
                _ => false,
            };
            if !ok {
                let list = if self.tunables.is_empty() {
                    "none declared".to_string()
                } else {
                    self.tunables.join(", ")
                };
                self.err(
                    arg.span(),
                    format!(
                        "tile shapes must be compile-time constants: an integer literal, a tunable ({list}) or an UPPER_CASE `const`; \
                         a run-time value cannot size a tile"
                    ),
                );
            }
        }
    }

    fn check_call(&mut self, call: &ExprCall) {
        let Expr::Path(p) = &*call.func else {
            self.err(call.func.span(), "only named functions can be called in a kernel: DSL intrinsics or `#[kernel(helper)]` functions");
            return;
        };
        if let Some(q) = &p.qself {
            let prim = matches!(&*q.ty, Type::Path(tp) if tp.path.get_ident().is_some_and(|i| PRIMITIVES.iter().any(|p| i == p)));
            if !prim {
                self.err(
                    q.ty.span(),
                    "only scalar functions of primitive types (`f32::sqrt`) can be called through a type in a kernel",
                );
            }
            return;
        }
        let segs = &p.path.segments;
        let first = segs[0].ident.to_string();
        if segs.len() == 1 {
            if let Some(intr) = intrinsics::find(&first) {
                self.check_shape_args(&segs[0], intr);
                return;
            }
            if self.helpers.iter().any(|h| h == &segs[0].ident) {
                return;
            }
            if self.closures.iter().any(|c| c == &segs[0].ident) {
                return;
            }
            self.err(
                segs[0].ident.span(),
                format!(
                    "`{first}` is not a DSL intrinsic or a declared helper. Intrinsics: {}. \
                     To call your own function, mark it `#[kernel(helper)]` and list it here with `helpers({first})`",
                    intrinsics::summary()
                ),
            );
            return;
        }
        let heap = segs.iter().find(|s| {
            matches!(
                s.ident.to_string().as_str(),
                "Vec"
                    | "Box"
                    | "String"
                    | "HashMap"
                    | "BTreeMap"
                    | "HashSet"
                    | "BTreeSet"
                    | "VecDeque"
                    | "Rc"
                    | "Arc"
            )
        });
        if let Some(h) = heap {
            self.err(
                h.ident.span(),
                format!("heap allocation (`{}`) is not available on the accelerator; keep data in tiles (`zeros::<T, R, C>()`, `load`)", h.ident),
            );
            return;
        }
        if PRIMITIVES.contains(&first.as_str()) {
            return;
        }
        self.err(
            call.func.span(),
            format!("`{}` is not callable in a kernel: only DSL intrinsics, declared helpers and scalar functions of primitive types (`f32::sqrt`) are", quote::quote!(#p).to_string().replace(' ', "")),
        );
    }
}

impl<'ast> Visit<'ast> for Validator<'_> {
    fn visit_expr(&mut self, e: &'ast Expr) {
        match e {
            Expr::Closure(c) => {
                let (or1, inputs, or2) = (&c.or1_token, &c.inputs, &c.or2_token);
                self.errors.push(syn::Error::new_spanned(
                    quote::quote!(#or1 #inputs #or2),
                    "closures are not allowed in a kernel; write the code inline or in a `#[kernel(helper)]` function",
                ));
                return;
            }
            Expr::While(w) => {
                self.err(
                    w.while_token.span,
                    "`while` loops are not allowed: a loop's trip count must not depend on data; use `for i in a..b` or `for i in (a..b).step_by(s)`",
                );
                return;
            }
            Expr::Loop(l) => {
                self.err(
                    l.loop_token.span,
                    "`loop` is not allowed: use a bounded `for i in a..b` loop",
                );
                return;
            }
            Expr::Unsafe(u) => {
                self.err(u.unsafe_token.span, "`unsafe` is not allowed in kernels: device memory is reached only through intrinsics");
                return;
            }
            Expr::Macro(m) => {
                self.macro_err(&m.mac);
                return;
            }
            Expr::Async(a) => {
                self.err(
                    a.async_token.span,
                    "`async` blocks are not allowed in kernels",
                );
                return;
            }
            Expr::Try(t) => {
                self.err(
                    t.question_token.span,
                    "`?` is not allowed in kernels: intrinsics report errors through the launch",
                );
                return;
            }
            Expr::Call(c) => self.check_call(c),
            _ => {}
        }
        visit::visit_expr(self, e);
    }

    fn visit_stmt(&mut self, s: &'ast syn::Stmt) {
        match s {
            syn::Stmt::Macro(m) => self.macro_err(&m.mac),
            syn::Stmt::Item(it) => {
                self.err(it.span(), "items (fn, struct, use...) cannot be declared inside a kernel; put them at module level (consts are fine there)")
            }
            _ => visit::visit_stmt(self, s),
        }
    }

    fn visit_local(&mut self, l: &'ast syn::Local) {
        if let (syn::Pat::Ident(pi), Some(init)) = (&l.pat, &l.init) {
            if matches!(&*init.expr, Expr::Closure(_)) {
                self.closures.push(pi.ident.clone());
            }
        }
        visit::visit_local(self, l);
    }

    fn visit_expr_method_call(&mut self, m: &'ast ExprMethodCall) {
        let name = m.method.to_string();
        if !METHODS.contains(&name.as_str()) {
            self.err(
                m.method.span(),
                format!(
                    "method `.{name}()` is not available in kernels; allowed methods: {}",
                    METHODS.join(", ")
                ),
            );
        }
        visit::visit_expr_method_call(self, m);
    }

    fn visit_expr_for_loop(&mut self, f: &'ast ExprForLoop) {
        if !is_range_like(&f.expr) {
            self.err(
                f.expr.span(),
                "`for` loops run over integer ranges only: `a..b`, `a..=b`, `(a..b).step_by(s)` or `(a..b).rev()`",
            );
        }
        visit::visit_expr_for_loop(self, f);
    }
}

impl Validator<'_> {
    fn macro_err(&mut self, mac: &syn::Macro) {
        let name = mac
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        let msg = if name == "vec" {
            "heap allocation (`vec!`) is not available on the accelerator; keep data in tiles (`zeros::<T, R, C>()`, `load`)".to_string()
        } else {
            format!("macros (`{name}!`) are not allowed in kernels: the body must be DSL code the simulator can attribute to lines")
        };
        self.err(mac.path.span(), msg);
    }
}

fn is_range_like(e: &Expr) -> bool {
    match e {
        Expr::Range(_) => true,
        Expr::Paren(p) => is_range_like(&p.expr),
        Expr::MethodCall(m) => {
            matches!(m.method.to_string().as_str(), "step_by" | "rev") && is_range_like(&m.receiver)
        }
        _ => false,
    }
}
