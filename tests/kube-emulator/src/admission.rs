//! ValidatingAdmissionPolicy (`admissionregistration.k8s.io/v1`), judged the
//! way kube-apiserver's policy plugin judges a write
//! (`staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating`).
//!
//! Owns: the decision of one policy and one of its bindings on one
//! AdmissionRequest ([`judge`], pure), and the request the server hands it
//! ([`Caller`], [`Target`]). In the API server's order:
//!
//! 1. the admission configuration kinds themselves (webhook configurations,
//!    policies, bindings) are never judged;
//! 2. the policy's `matchConstraints` (`namespaceSelector`, `objectSelector`,
//!    `excludeResourceRules`, `resourceRules`: groups, versions, resources as
//!    `name`, `name/sub`, `*`, `*/sub`, `name/*`, `*/*`, operations, scope,
//!    `resourceNames`), then the binding's `matchResources`: outside them,
//!    [`Verdict::NotMatched`];
//! 3. the binding's params (`paramKind` + `paramRef`): a missing param with
//!    `parameterNotFoundAction: Deny` refuses the request *before* any match
//!    condition is evaluated (a configuration error, subject to
//!    `failurePolicy`), with `Allow` nothing is evaluated;
//! 4. `matchConditions` (any false: not matched; errors: `failurePolicy`);
//! 5. `validations` in order, each with its `messageExpression`, `message` or
//!    `failed expression: EXPR`, and `reason` (default `Invalid`), the
//!    policy's `variables` evaluated lazily, on first use, as the API server
//!    does (a variable that fails only matters to the expressions reading it).
//!
//! CEL is the `cel` crate's: its standard library and error wording, without
//! type checking (a non-bool result is an error when evaluated) and without
//! the Kubernetes extension libraries (`authorizer`, `quantity()`, `url()`,
//! ...). Cost budgets are not enforced.
//!
//! Must not: touch the store (the caller looks the params and namespace up),
//! or do I/O.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use cel::common::traits::Indexer;
use cel::common::types::{CelString, MAP_TYPE, Type};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{Context, Env, ExecutionError, Program, Value as CelValue};
use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use serde_json::{Value, json};

use crate::reviews::UserInfo;
use crate::selector::LabelSelector;

/// What a policy's binding decides on one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Outside the policy's `matchConstraints` or the binding's
    /// `matchResources`, or a match condition is false.
    NotMatched,
    /// Matched, and every validation is true (or the param is missing with
    /// `parameterNotFoundAction: Allow`, or an error was let through by
    /// `failurePolicy: Ignore`, or the binding does not `Deny`).
    Allowed,
    /// Refused: the answer is `code` with `reason`.
    Denied {
        /// 403 for `Forbidden`, 401 `Unauthorized`, 413 `RequestEntityTooLarge`,
        /// 422 `Invalid` (the default, also for errors).
        code: u16,
        reason: String,
        /// `ValidatingAdmissionPolicy 'P' with binding 'B' denied request: ...`
        /// (the server's Status message puts `<resource> "<name>" is
        /// forbidden: ` before it).
        message: String,
        /// The denial comes from an expression that does not compile or
        /// failed to evaluate (with `failurePolicy: Fail`), not from a
        /// validation that was false or a missing param.
        expression_error: bool,
    },
}

/// The param a binding names, as the caller found it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Param<'a> {
    Found(&'a Value),
    /// Not there (or the policy takes none: then it does not matter).
    Missing,
    /// The binding cannot name one here (e.g. a namespaced param for a
    /// cluster-scoped request without `paramRef.namespace`).
    Error(&'a str),
}

/// What [`evaluate`] judges, besides the policy and binding.
pub(crate) struct Inputs<'a> {
    /// An AdmissionRequest (`request` of an AdmissionReview), with `object`
    /// and `oldObject` in it.
    pub request: &'a Value,
    /// The request's Namespace, for `namespaceSelector` and `namespaceObject`.
    pub namespace: Option<&'a Value>,
    pub param: Param<'a>,
}

/// Judges `request`, an AdmissionRequest as an AdmissionReview carries it
/// (`object` and `oldObject` in it, null or absent where there is none), by
/// `policy` through `binding`, with `params` the object the binding's
/// `paramRef` names (None: it does not exist). The request's namespace is
/// unknown: a `namespaceSelector` sees no labels, `namespaceObject` is null.
pub fn judge(
    request: &Value,
    policy: &ValidatingAdmissionPolicy,
    binding: &ValidatingAdmissionPolicyBinding,
    params: Option<&Value>,
) -> Verdict {
    judge_in_namespace(request, None, policy, binding, params)
}

/// [`judge`] with the request's Namespace object (None for a cluster-scoped
/// request).
pub fn judge_in_namespace(
    request: &Value,
    namespace: Option<&Value>,
    policy: &ValidatingAdmissionPolicy,
    binding: &ValidatingAdmissionPolicyBinding,
    params: Option<&Value>,
) -> Verdict {
    let param = params.map_or(Param::Missing, Param::Found);
    evaluate(
        policy,
        binding,
        &Inputs {
            request,
            namespace,
            param,
        },
    )
}

/// How a failure (an expression error, a configuration error) is handled.
#[derive(Clone, Copy, PartialEq)]
enum FailurePolicy {
    Fail,
    Ignore,
}

/// One decision before it is worded for the binding.
struct Refusal {
    reason: String,
    message: String,
    expression_error: bool,
}

impl Refusal {
    fn error(message: String) -> Self {
        Self {
            reason: String::new(),
            message,
            expression_error: true,
        }
    }
}

/// The status code the API server answers a denial's reason with.
fn code_for(reason: &str) -> u16 {
    match reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    }
}

/// The decision of `policy` through `binding` on `inputs`.
pub(crate) fn evaluate(
    policy: &ValidatingAdmissionPolicy,
    binding: &ValidatingAdmissionPolicyBinding,
    inputs: &Inputs<'_>,
) -> Verdict {
    let policy_name = policy.metadata.name.as_deref().unwrap_or_default();
    let binding_name = binding.metadata.name.as_deref().unwrap_or_default();
    let (Some(spec), Some(bspec)) = (&policy.spec, &binding.spec) else {
        return Verdict::NotMatched;
    };
    if bspec.policy_name.as_deref() != Some(policy_name) {
        return Verdict::NotMatched;
    }
    let request = inputs.request;
    if exempt(request) {
        return Verdict::NotMatched;
    }
    let object = present(request.get("object"));
    let old_object = present(request.get("oldObject"));
    let failure = match spec.failure_policy.as_deref() {
        Some("Ignore") => FailurePolicy::Ignore,
        _ => FailurePolicy::Fail,
    };
    let deny = bspec
        .validation_actions
        .iter()
        .flatten()
        .any(|a| a == "Deny");
    let word = |refusal: Refusal| -> Verdict {
        if !deny || (refusal.expression_error && failure == FailurePolicy::Ignore) {
            return Verdict::Allowed;
        }
        let reason = if refusal.reason.is_empty() {
            "Invalid".to_owned()
        } else {
            refusal.reason
        };
        Verdict::Denied {
            code: code_for(&reason),
            reason,
            message: format!(
                "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: {}",
                refusal.message
            ),
            expression_error: refusal.expression_error,
        }
    };
    let matched = |m: &MatchResources, binding: bool| {
        matches(m, binding, request, object, old_object, inputs.namespace)
    };
    match spec.match_constraints.as_ref().map(|m| matched(m, false)) {
        Some(Ok(true)) => {}
        None | Some(Ok(false)) => return Verdict::NotMatched,
        Some(Err(e)) => {
            return config_error(word, failure, format!("failed to configure policy: {e}"));
        }
    }
    if let Some(m) = &bspec.match_resources {
        match matched(m, true) {
            Ok(true) => {}
            Ok(false) => return Verdict::NotMatched,
            Err(e) => {
                return config_error(word, failure, format!("failed to configure binding: {e}"));
            }
        }
    }
    // Params are collected before any match condition is evaluated.
    let params = match (&spec.param_kind, &bspec.param_ref, inputs.param) {
        (None, _, _) | (Some(_), None, _) => Value::Null,
        (Some(_), Some(_), Param::Found(p)) => p.clone(),
        (Some(_), Some(_), Param::Error(e)) => {
            return config_error(word, failure, format!("failed to configure binding: {e}"));
        }
        (Some(_), Some(r), Param::Missing) => {
            if r.parameter_not_found_action.as_deref() == Some("Deny") {
                return config_error(
                    word,
                    failure,
                    "failed to configure binding: no params found for policy binding with `Deny` \
                     parameterNotFoundAction"
                        .to_owned(),
                );
            }
            // Allow: no param, nothing to validate with.
            return Verdict::Allowed;
        }
    };
    let cel = match Activation::new(request, object, old_object, &params, inputs, spec) {
        Ok(a) => a,
        Err(e) => return word(Refusal::error(e)),
    };

    // Match conditions: any false and the policy does not apply; errors
    // (when none is false) follow the failure policy.
    let mut errors = Vec::new();
    for condition in spec.match_conditions.iter().flatten() {
        match cel.condition(&condition.expression) {
            Ok(true) => {}
            Ok(false) => return Verdict::NotMatched,
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        if failure == FailurePolicy::Ignore {
            return Verdict::NotMatched;
        }
        let message = if errors.len() == 1 {
            errors.remove(0)
        } else {
            format!("[{}]", errors.join(", "))
        };
        return word(Refusal::error(message));
    }

    for validation in spec.validations.iter().flatten() {
        let refusal = match cel.condition(&validation.expression) {
            Ok(true) => continue,
            Err(e) => Refusal::error(e),
            Ok(false) => {
                let from_expression = validation
                    .message_expression
                    .as_deref()
                    .and_then(|m| cel.message(m));
                let message = from_expression
                    .or_else(|| {
                        validation
                            .message
                            .as_deref()
                            .map(str::trim)
                            .filter(|m| !m.is_empty())
                            .map(str::to_owned)
                    })
                    .unwrap_or_else(|| {
                        format!("failed expression: {}", validation.expression.trim())
                    });
                Refusal {
                    reason: validation.reason.clone().unwrap_or_default(),
                    message,
                    expression_error: false,
                }
            }
        };
        match word(refusal) {
            Verdict::Allowed => continue,
            v => return v,
        }
    }
    Verdict::Allowed
}

/// A configuration error: refused with Fail, ignored (allowed) with Ignore.
fn config_error(
    word: impl Fn(Refusal) -> Verdict,
    failure: FailurePolicy,
    message: String,
) -> Verdict {
    if failure == FailurePolicy::Ignore {
        return Verdict::Allowed;
    }
    word(Refusal {
        reason: String::new(),
        message,
        expression_error: false,
    })
}

/// `Some` unless absent or null.
fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    v.pointer(path).and_then(Value::as_str).unwrap_or_default()
}

/// The admission configuration kinds, which no policy judges (as the API
/// server exempts them, so a policy cannot lock itself in).
fn exempt(request: &Value) -> bool {
    str_at(request, "/kind/group") == "admissionregistration.k8s.io"
        && matches!(
            str_at(request, "/kind/kind"),
            "ValidatingWebhookConfiguration"
                | "MutatingWebhookConfiguration"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
                | "MutatingAdmissionPolicy"
                | "MutatingAdmissionPolicyBinding"
        )
}

fn selector(
    s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
) -> Result<Option<LabelSelector>, String> {
    let Some(s) = s else { return Ok(None) };
    let v = serde_json::to_value(s).map_err(|e| e.to_string())?;
    match LabelSelector::from_object(&v) {
        Some(sel) if sel.is_empty() => Ok(None),
        Some(sel) => Ok(Some(sel)),
        None => Err(format!("invalid label selector {v}")),
    }
}

fn labels(v: Option<&Value>) -> Option<&serde_json::Map<String, Value>> {
    v.and_then(|v| v.pointer("/metadata/labels"))
        .and_then(Value::as_object)
}

/// Whether `m` (a policy's `matchConstraints`, or a binding's
/// `matchResources`) covers the request, in the API server's order:
/// namespace selector, object selector, excluded rules, rules.
fn matches(
    m: &MatchResources,
    binding: bool,
    request: &Value,
    object: Option<&Value>,
    old_object: Option<&Value>,
    namespace: Option<&Value>,
) -> Result<bool, String> {
    let resource = str_at(request, "/resource/resource");
    let request_namespace = str_at(request, "/namespace");
    // Cluster-scoped requests other than Namespaces always pass the namespace
    // selector; a Namespace is judged by its own labels.
    if let Some(sel) = selector(&m.namespace_selector)?
        && !(request_namespace.is_empty() && resource != "namespaces")
    {
        let ns_labels = if resource == "namespaces" && str_at(request, "/subResource").is_empty() {
            labels(object.or(old_object))
        } else {
            labels(namespace)
        };
        if !sel.matches(ns_labels) {
            return Ok(false);
        }
    }
    if let Some(sel) = selector(&m.object_selector)? {
        let any = |o: Option<&Value>| o.is_some_and(|o| sel.matches(labels(Some(o))));
        if !(any(object) || any(old_object)) {
            return Ok(false);
        }
    }
    if m.exclude_resource_rules
        .iter()
        .flatten()
        .any(|r| rule_covers(r, request))
    {
        return Ok(false);
    }
    if binding && m.resource_rules.is_none() {
        return Ok(true);
    }
    Ok(m.resource_rules
        .iter()
        .flatten()
        .any(|r| rule_covers(r, request)))
}

/// Whether one resource rule covers the request (`matchPolicy: Equivalent`
/// is not applied: the emulator serves each built-in resource in one
/// version, and converts none).
fn rule_covers(rule: &NamedRuleWithOperations, request: &Value) -> bool {
    let listed = |list: &Option<Vec<String>>, value: &str| {
        list.iter().flatten().any(|v| v == "*" || v == value)
    };
    let resource = str_at(request, "/resource/resource");
    let sub = str_at(request, "/subResource");
    let resource_ok = rule.resources.iter().flatten().any(|r| {
        let (res, rsub) = r.split_once('/').unwrap_or((r.as_str(), ""));
        (res == "*" || res == resource) && (rsub == "*" || rsub == sub)
    });
    let namespaced = !str_at(request, "/namespace").is_empty();
    let scope_ok = match rule.scope.as_deref() {
        Some("Namespaced") => namespaced,
        Some("Cluster") => !namespaced,
        _ => true,
    };
    let name_ok = match &rule.resource_names {
        Some(names) if !names.is_empty() => {
            let name = str_at(request, "/name");
            names.iter().any(|n| n == name)
        }
        _ => true,
    };
    listed(&rule.operations, str_at(request, "/operation"))
        && listed(&rule.api_groups, str_at(request, "/resource/group"))
        && listed(&rule.api_versions, str_at(request, "/resource/version"))
        && resource_ok
        && scope_ok
        && name_ok
}

// ---------------------------------------------------------------------------
// CEL

/// The standard environment, built once.
fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(Env::stdlib())).clone()
}

/// A compiled expression, or the compilation error as the API server words it.
type Compiled = Result<Arc<Program>, String>;

/// Compiles `expression`, once per distinct text.
fn compile(expression: &str) -> Compiled {
    static CACHE: OnceLock<Mutex<HashMap<String, Compiled>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = cache.get(expression) {
        return c.clone();
    }
    if cache.len() > 10_000 {
        cache.clear();
    }
    let compiled = Program::compile(expression)
        .map(Arc::new)
        .map_err(|e| format!("compilation error: {e}"));
    cache.insert(expression.to_owned(), compiled.clone());
    compiled
}

/// JSON as a CEL value.
fn to_val(json: &Value, what: &str) -> Result<Box<dyn Val>, String> {
    let v = cel::to_value(json)
        .map_err(|e| format!("failed to prepare {what} variable for evaluation: {e}"))?;
    Box::<dyn Val>::try_from(v)
        .map_err(|e| format!("failed to prepare {what} variable for evaluation: {e}"))
}

/// What every expression of one evaluation sees: the request's variables, and
/// the policy's `variables`, each computed on first use.
struct Shared {
    request: Box<dyn Val>,
    object: Box<dyn Val>,
    old_object: Box<dyn Val>,
    params: Box<dyn Val>,
    namespace_object: Box<dyn Val>,
    env: Arc<Env>,
    names: Vec<String>,
    programs: Vec<Compiled>,
    values: Vec<OnceLock<Result<Box<dyn Val>, ExecutionError>>>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("variables", &self.names)
            .finish_non_exhaustive()
    }
}

/// `variables`: the first `visible` of the policy's variables (an expression
/// of a variable sees those before it only).
#[derive(Clone, Debug)]
struct Variables {
    shared: Arc<Shared>,
    visible: usize,
}

static VARIABLES_TYPE: Type = Type::new_unspecified_type("kubernetes.variables");

impl Val for Variables {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &VARIABLES_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }
}

impl Indexer for Variables {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let Some(name) = idx.downcast_ref::<CelString>().map(CelString::inner) else {
            return Err(ExecutionError::UnexpectedType {
                got: idx.get_type().name().to_owned(),
                want: "string".to_owned(),
            });
        };
        let Some(i) = self.shared.names[..self.visible]
            .iter()
            .position(|n| n == name)
        else {
            return Err(ExecutionError::no_such_key(name));
        };
        let value = self.shared.values[i].get_or_init(|| self.shared.variable(i));
        match value {
            Ok(v) => Ok(CowVal::Borrowed(v.as_ref())),
            Err(e) => Err(e.clone()),
        }
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

/// The names an expression resolves: `request`, `object`, `oldObject`,
/// `params`, `namespaceObject`, `variables`.
struct Scope {
    variables: Variables,
}

impl VariableResolver for Scope {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let shared = &self.variables.shared;
        let v: &'b (dyn Val + 'b) = match variable {
            "request" => shared.request.as_ref(),
            "object" => shared.object.as_ref(),
            "oldObject" => shared.old_object.as_ref(),
            "params" => shared.params.as_ref(),
            "namespaceObject" => shared.namespace_object.as_ref(),
            "variables" => &self.variables,
            _ => return None,
        };
        Some(CowVal::Borrowed(v))
    }
}

impl Shared {
    fn run(
        self: &Arc<Self>,
        program: &Program,
        visible: usize,
    ) -> Result<CelValue, ExecutionError> {
        let scope = Scope {
            variables: Variables {
                shared: self.clone(),
                visible,
            },
        };
        let mut context = Context::with_env(self.env.clone());
        context.set_variable_resolver(&scope);
        program.execute(&context)
    }

    /// Variable `i`, computed (it sees the variables before it).
    fn variable(self: &Arc<Self>, i: usize) -> Result<Box<dyn Val>, ExecutionError> {
        let name = &self.names[i];
        let failed = |message: String| ExecutionError::FunctionError {
            function: "variables".to_owned(),
            message,
        };
        let program = self.programs[i].as_ref().map_err(|e| {
            failed(format!(
                "composited variable \"{name}\" fails to compile: {e}"
            ))
        })?;
        let value = self.run(program, i).map_err(|e| {
            failed(format!(
                "composited variable \"{name}\" fails to evaluate: {e}"
            ))
        })?;
        Box::<dyn Val>::try_from(value)
    }
}

/// One evaluation's CEL state.
struct Activation {
    shared: Arc<Shared>,
}

impl Activation {
    fn new(
        request: &Value,
        object: Option<&Value>,
        old_object: Option<&Value>,
        params: &Value,
        inputs: &Inputs<'_>,
        spec: &k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicySpec,
    ) -> Result<Self, String> {
        // `request` as the API server binds it: the AdmissionRequest without
        // its objects (those are `object` and `oldObject`).
        let mut bare = request.clone();
        if let Some(m) = bare.as_object_mut() {
            m.insert("object".into(), Value::Null);
            m.insert("oldObject".into(), Value::Null);
        }
        let namespace_object = match inputs.namespace {
            // The Namespace's own object is not its namespaceObject.
            Some(ns) if !is_namespace_kind(request) => namespace_object(ns),
            _ => Value::Null,
        };
        let variables = spec.variables.iter().flatten();
        let shared = Shared {
            request: to_val(&bare, "request")?,
            object: to_val(object.unwrap_or(&Value::Null), "object")?,
            old_object: to_val(old_object.unwrap_or(&Value::Null), "oldObject")?,
            params: to_val(params, "params")?,
            namespace_object: to_val(&namespace_object, "namespaceObject")?,
            env: env(),
            names: variables.clone().map(|v| v.name.clone()).collect(),
            programs: variables.clone().map(|v| compile(&v.expression)).collect(),
            values: variables.map(|_| OnceLock::new()).collect(),
        };
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// A boolean expression (match condition, validation); errors worded as
    /// the API server's.
    fn condition(&self, expression: &str) -> Result<bool, String> {
        let program = compile(expression)?;
        match self.shared.run(&program, self.shared.names.len()) {
            Ok(CelValue::Bool(b)) => Ok(b),
            Ok(other) => Err(format!(
                "compilation error: expression '{expression}' must evaluate to bool, not {other:?}"
            )),
            Err(e) => Err(format!("expression '{expression}' resulted in error: {e}")),
        }
    }

    /// A `messageExpression`'s message, if it is a usable one: a string,
    /// trimmed, not empty, one line, at most 5 KiB.
    fn message(&self, expression: &str) -> Option<String> {
        let program = compile(expression).ok()?;
        match self.shared.run(&program, self.shared.names.len()) {
            Ok(CelValue::String(s)) => {
                let s = s.trim();
                (!s.is_empty() && !s.contains('\n') && s.len() <= 5 * 1024).then(|| s.to_owned())
            }
            _ => None,
        }
    }
}

fn is_namespace_kind(request: &Value) -> bool {
    str_at(request, "/kind/group").is_empty()
        && str_at(request, "/kind/version") == "v1"
        && str_at(request, "/kind/kind") == "Namespace"
}

/// `namespaceObject`: the Namespace's metadata (without managed fields and
/// owner references), spec and status, as the API server exposes it.
fn namespace_object(ns: &Value) -> Value {
    let mut meta = serde_json::Map::new();
    if let Some(m) = ns.get("metadata").and_then(Value::as_object) {
        for f in [
            "name",
            "generateName",
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "labels",
            "annotations",
            "finalizers",
        ] {
            if let Some(v) = m.get(f) {
                meta.insert(f.into(), v.clone());
            }
        }
    }
    let mut out = json!({"metadata": meta});
    for f in ["spec", "status"] {
        if let Some(v) = ns.get(f) {
            out[f] = v.clone();
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The request, as the server builds it

/// An admission operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// Who sent a write, and the options it sent: what the server knows of a
/// request before the store computes the objects.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    pub user: UserInfo,
    pub dry_run: bool,
    pub field_manager: Option<String>,
    pub field_validation: Option<String>,
    /// A delete's `DeleteOptions` body (null if none).
    pub delete_options: Value,
    /// A deletecollection: each object is judged with no request name, as
    /// the API server does.
    pub collection: bool,
}

impl Caller {
    /// `request.options`: CreateOptions for a create (a POST, or an apply
    /// that creates), UpdateOptions for an update (a PUT or any PATCH),
    /// DeleteOptions for a delete.
    fn options(&self, op: Operation) -> Value {
        let kind = match op {
            Operation::Create => "CreateOptions",
            Operation::Update => "UpdateOptions",
            Operation::Delete => "DeleteOptions",
        };
        let mut o = match (op, &self.delete_options) {
            (Operation::Delete, Value::Object(m)) => Value::Object(m.clone()),
            _ => json!({}),
        };
        o["kind"] = json!(kind);
        o["apiVersion"] = json!("meta.k8s.io/v1");
        if self.dry_run {
            o["dryRun"] = json!(["All"]);
        }
        if op != Operation::Delete {
            if let Some(m) = &self.field_manager {
                o["fieldManager"] = json!(m);
            }
            if let Some(v) = &self.field_validation {
                o["fieldValidation"] = json!(v);
            }
        }
        o
    }
}

/// What a write is to: kind and resource (group, version, name), the
/// subresource, and the object's name and namespace.
#[derive(Clone, Debug)]
pub(crate) struct Target<'a> {
    pub kind: (&'a str, &'a str, &'a str),
    pub resource: (&'a str, &'a str, &'a str),
    pub sub_resource: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub operation: Operation,
}

impl Target<'_> {
    /// The AdmissionRequest of this write by `caller`, with its objects.
    pub fn request(&self, caller: &Caller, object: Option<&Value>, old: Option<&Value>) -> Value {
        let (kg, kv, kk) = self.kind;
        let (rg, rv, rr) = self.resource;
        let name = if caller.collection { "" } else { self.name };
        let mut r = json!({
            // The API server gives policies no uid (webhooks get one).
            "uid": "",
            "kind": {"group": kg, "version": kv, "kind": kk},
            "resource": {"group": rg, "version": rv, "resource": rr},
            "requestKind": {"group": kg, "version": kv, "kind": kk},
            "requestResource": {"group": rg, "version": rv, "resource": rr},
            "operation": self.operation.as_str(),
            "userInfo": caller.user.to_json(),
            "dryRun": caller.dry_run,
            "options": caller.options(self.operation),
            "object": object.cloned().unwrap_or(Value::Null),
            "oldObject": old.cloned().unwrap_or(Value::Null),
        });
        // Fields the API server's JSON leaves out when empty.
        if !self.sub_resource.is_empty() {
            r["subResource"] = json!(self.sub_resource);
            r["requestSubResource"] = json!(self.sub_resource);
        }
        if !name.is_empty() {
            r["name"] = json!(name);
        }
        if !self.namespace.is_empty() {
            r["namespace"] = json!(self.namespace);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: Value) -> ValidatingAdmissionPolicy {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn binding(spec: Value) -> ValidatingAdmissionPolicyBinding {
        let mut spec = spec;
        spec["policyName"] = json!("p");
        serde_json::from_value(json!({"metadata": {"name": "b"}, "spec": spec})).unwrap()
    }

    fn deny() -> ValidatingAdmissionPolicyBinding {
        binding(json!({"validationActions": ["Deny"]}))
    }

    fn rules(resources: &[&str], operations: &[&str]) -> Value {
        json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
            "resources": resources, "operations": operations}]})
    }

    fn request(op: &str, resource: &str, sub: &str, user: &str) -> Value {
        let mut r = json!({
            "uid": "", "operation": op, "name": "x", "namespace": "ns",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "userInfo": {"username": user},
            "object": {"metadata": {"name": "x", "labels": {"a": "1"}}, "data": {"k": "v"}},
            "oldObject": null,
        });
        if !sub.is_empty() {
            r["subResource"] = json!(sub);
        }
        r
    }

    fn assert_expression_error(v: &Verdict) {
        assert!(
            matches!(
                v,
                Verdict::Denied {
                    expression_error: true,
                    ..
                }
            ),
            "not an expression error: {v:?}"
        );
    }

    fn denied_message(v: &Verdict) -> &str {
        match v {
            Verdict::Denied { message, .. } => message,
            other => panic!("not denied: {other:?}"),
        }
    }

    #[test]
    fn rules_match_resources_subresources_and_operations() {
        let r = |resources: &[&str], ops: &[&str]| -> NamedRuleWithOperations {
            serde_json::from_value(json!({"apiGroups": ["*"], "apiVersions": ["v1"],
                "resources": resources, "operations": ops}))
            .unwrap()
        };
        let main = request("UPDATE", "nodes", "", "u");
        let status = request("UPDATE", "nodes", "status", "u");
        assert!(rule_covers(&r(&["nodes"], &["UPDATE"]), &main));
        assert!(!rule_covers(&r(&["nodes"], &["UPDATE"]), &status));
        assert!(rule_covers(&r(&["nodes/status"], &["*"]), &status));
        assert!(rule_covers(&r(&["*/status"], &["UPDATE"]), &status));
        assert!(rule_covers(&r(&["nodes/*"], &["UPDATE"]), &status));
        assert!(rule_covers(&r(&["*"], &["UPDATE"]), &main));
        assert!(!rule_covers(&r(&["*"], &["UPDATE"]), &status));
        assert!(rule_covers(&r(&["*/*"], &["UPDATE"]), &status));
        assert!(!rule_covers(&r(&["nodes"], &["CREATE", "DELETE"]), &main));
        let mut v2 = main.clone();
        v2["resource"]["version"] = json!("v2");
        assert!(!rule_covers(&r(&["nodes"], &["UPDATE"]), &v2));
        let named: NamedRuleWithOperations = serde_json::from_value(json!({
            "apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes"],
            "operations": ["UPDATE"], "resourceNames": ["y"], "scope": "Namespaced"}))
        .unwrap();
        assert!(!rule_covers(&named, &main), "x is not named");
    }

    #[test]
    fn a_false_validation_is_denied_with_its_reason_and_message() {
        let p = policy(json!({
            "matchConstraints": rules(&["configmaps"], &["CREATE"]),
            "validations": [
                {"expression": "object.data.k == 'v'"},
                {"expression": "object.data.k == 'w'", "reason": "Forbidden",
                 "messageExpression": "'k is ' + object.data.k"},
            ],
        }));
        let v = judge(&request("CREATE", "configmaps", "", "u"), &p, &deny(), None);
        assert_eq!(
            v,
            Verdict::Denied {
                code: 403,
                reason: "Forbidden".into(),
                message: "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: k is v"
                    .into(),
                expression_error: false,
            }
        );
        // Only Deny refuses.
        let warn = binding(json!({"validationActions": ["Warn"]}));
        assert_eq!(
            judge(&request("CREATE", "configmaps", "", "u"), &p, &warn, None),
            Verdict::Allowed
        );
        // Other operations are not matched.
        assert_eq!(
            judge(&request("UPDATE", "configmaps", "", "u"), &p, &deny(), None),
            Verdict::NotMatched
        );
    }

    #[test]
    fn messages_fall_back_to_message_then_the_expression() {
        let p = policy(json!({
            "matchConstraints": rules(&["configmaps"], &["*"]),
            "validations": [{"expression": " false ", "message": " plain ",
                             "messageExpression": "'two\\nlines'"}],
        }));
        let v = judge(&request("CREATE", "configmaps", "", "u"), &p, &deny(), None);
        assert!(
            denied_message(&v).ends_with("denied request: plain"),
            "{v:?}"
        );
        let p = policy(json!({
            "matchConstraints": rules(&["configmaps"], &["*"]),
            "validations": [{"expression": " false "}],
        }));
        let v = judge(&request("CREATE", "configmaps", "", "u"), &p, &deny(), None);
        assert!(
            denied_message(&v).ends_with("denied request: failed expression: false"),
            "{v:?}"
        );
        assert!(matches!(v, Verdict::Denied { code: 422, .. }), "{v:?}");
    }

    #[test]
    fn errors_follow_the_failure_policy() {
        let spec = |failure: &str| {
            policy(json!({
                "failurePolicy": failure,
                "matchConstraints": rules(&["configmaps"], &["*"]),
                "validations": [{"expression": "object.spec.missing == 1", "reason": "Forbidden"}],
            }))
        };
        let r = request("CREATE", "configmaps", "", "u");
        let v = judge(&r, &spec("Fail"), &deny(), None);
        let Verdict::Denied {
            code,
            reason,
            message,
            expression_error,
        } = &v
        else {
            panic!("{v:?}");
        };
        // An error has no reason of its own: Invalid.
        assert_eq!(
            (*code, reason.as_str(), *expression_error),
            (422, "Invalid", true)
        );
        assert!(
            message.contains("expression 'object.spec.missing == 1' resulted in error"),
            "{message}"
        );
        assert_eq!(judge(&r, &spec("Ignore"), &deny(), None), Verdict::Allowed);
        // A syntax error is an error of every evaluation.
        let broken = policy(json!({
            "matchConstraints": rules(&["configmaps"], &["*"]),
            "validations": [{"expression": "object.data.k == "}],
        }));
        let v = judge(&r, &broken, &deny(), None);
        assert!(denied_message(&v).contains("compilation error"), "{v:?}");
    }

    #[test]
    fn match_conditions_false_beat_errors() {
        let p = |conditions: Value| {
            policy(json!({
                "matchConstraints": rules(&["configmaps"], &["*"]),
                "matchConditions": conditions,
                "validations": [{"expression": "false"}],
            }))
        };
        let r = request("CREATE", "configmaps", "", "u");
        let mine = json!([{"name": "me", "expression": "request.userInfo.username == 'u'"}]);
        assert!(matches!(
            judge(&r, &p(mine), &deny(), None),
            Verdict::Denied { .. }
        ));
        let other = json!([{"name": "me", "expression": "request.userInfo.username == 'v'"}]);
        assert_eq!(judge(&r, &p(other), &deny(), None), Verdict::NotMatched);
        let mixed = json!([
            {"name": "err", "expression": "request.nothing == 1"},
            {"name": "no", "expression": "false"},
        ]);
        assert_eq!(judge(&r, &p(mixed), &deny(), None), Verdict::NotMatched);
        let error = json!([{"name": "err", "expression": "request.nothing == 1"}]);
        let v = judge(&r, &p(error), &deny(), None);
        assert_expression_error(&v);
    }

    #[test]
    fn variables_are_lazy_and_see_those_before_them() {
        let p = |validation: &str| {
            policy(json!({
                "matchConstraints": rules(&["configmaps"], &["*"]),
                "variables": [
                    {"name": "k", "expression": "object.data.k"},
                    {"name": "broken", "expression": "object.nothing.here"},
                    {"name": "kk", "expression": "variables.k + variables.k"},
                    {"name": "ahead", "expression": "variables.later"},
                    {"name": "later", "expression": "1"},
                ],
                "validations": [{"expression": validation}],
            }))
        };
        let r = request("CREATE", "configmaps", "", "u");
        assert_eq!(
            judge(&r, &p("variables.kk == 'vv'"), &deny(), None),
            Verdict::Allowed
        );
        // The broken variable is never read here.
        assert_eq!(
            judge(
                &r,
                &p("variables.k == 'v' || variables.broken"),
                &deny(),
                None
            ),
            Verdict::Allowed
        );
        let v = judge(&r, &p("variables.broken == 1"), &deny(), None);
        assert!(
            denied_message(&v).contains("composited variable \"broken\" fails to evaluate"),
            "{v:?}"
        );
        // A variable cannot read one declared after it.
        let v = judge(&r, &p("variables.ahead == 1"), &deny(), None);
        assert_expression_error(&v);
    }

    #[test]
    fn params_are_bound_and_a_missing_one_denies_before_match_conditions() {
        let p = policy(json!({
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": rules(&["configmaps"], &["*"]),
            "matchConditions": [{"name": "never", "expression": "false"}],
            "validations": [{"expression": "object.data.k == params.data.want"}],
        }));
        let with = |action: &str| {
            binding(json!({"validationActions": ["Deny"],
                "paramRef": {"name": "want", "namespace": "ns", "parameterNotFoundAction": action}}))
        };
        let r = request("CREATE", "configmaps", "", "u");
        let v = judge(&r, &p, &with("Deny"), None);
        assert_eq!(
            v,
            Verdict::Denied {
                code: 422,
                reason: "Invalid".into(),
                message:
                    "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: failed to \
                          configure binding: no params found for policy binding with `Deny` \
                          parameterNotFoundAction"
                        .into(),
                expression_error: false,
            }
        );
        assert_eq!(judge(&r, &p, &with("Allow"), None), Verdict::Allowed);
        let param = json!({"data": {"want": "v"}});
        // Found: the (false) match condition applies.
        assert_eq!(
            judge(&r, &p, &with("Deny"), Some(&param)),
            Verdict::NotMatched
        );
    }

    #[test]
    fn selectors_narrow_the_match() {
        let p = |selectors: Value| {
            let mut m = rules(&["configmaps"], &["*"]);
            for (k, v) in selectors.as_object().unwrap() {
                m[k] = v.clone();
            }
            policy(json!({"matchConstraints": m, "validations": [{"expression": "false"}]}))
        };
        let r = request("CREATE", "configmaps", "", "u");
        let ns = json!({"metadata": {"name": "ns", "labels": {"team": "gpu"}}});
        let by_ns = p(json!({"namespaceSelector": {"matchLabels": {"team": "gpu"}}}));
        let judged = |pol: &ValidatingAdmissionPolicy, ns: Option<&Value>| {
            judge_in_namespace(&r, ns, pol, &deny(), None)
        };
        assert!(matches!(judged(&by_ns, Some(&ns)), Verdict::Denied { .. }));
        assert_eq!(judged(&by_ns, None), Verdict::NotMatched);
        let by_obj = p(json!({"objectSelector": {"matchLabels": {"a": "2"}}}));
        assert_eq!(judged(&by_obj, Some(&ns)), Verdict::NotMatched);
        let excluded = p(
            json!({"excludeResourceRules": [{"apiGroups": [""], "apiVersions": ["*"],
            "resources": ["configmaps"], "operations": ["CREATE"]}]}),
        );
        assert_eq!(judged(&excluded, Some(&ns)), Verdict::NotMatched);
        // A binding's matchResources narrows further; without rules it keeps all.
        let narrowing = binding(json!({"validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"team": "web"}}}}));
        assert_eq!(
            judge_in_namespace(&r, Some(&ns), &p(json!({})), &narrowing, None),
            Verdict::NotMatched
        );
    }

    #[test]
    fn the_request_is_what_the_server_sends() {
        let caller = Caller {
            user: UserInfo::service_account("kube-amd-gpu", "gpu-operator")
                .with_extra("authentication.kubernetes.io/node-name", &["n1"]),
            dry_run: false,
            field_manager: Some("m".into()),
            field_validation: None,
            delete_options: Value::Null,
            collection: false,
        };
        let t = Target {
            kind: ("", "v1", "Node"),
            resource: ("", "v1", "nodes"),
            sub_resource: "status",
            name: "n1",
            namespace: "",
            operation: Operation::Update,
        };
        let r = t.request(&caller, Some(&json!({"a": 1})), Some(&json!({"a": 0})));
        assert_eq!(r["subResource"], "status");
        assert_eq!(r["name"], "n1");
        assert!(r.get("namespace").is_none());
        assert_eq!(r["options"]["kind"], "UpdateOptions");
        assert_eq!(r["options"]["fieldManager"], "m");
        assert_eq!(
            r["userInfo"]["username"],
            "system:serviceaccount:kube-amd-gpu:gpu-operator"
        );
        assert_eq!(
            r["userInfo"]["extra"]["authentication.kubernetes.io/node-name"],
            json!(["n1"])
        );
        assert!(r["userInfo"].get("uid").is_none());
        assert_eq!(r["object"]["a"], 1);
        assert_eq!(r["oldObject"]["a"], 0);
    }
}
